-- The tier of each key, first setting the default on those with none.
--
-- KEYS: sync:tier:{id}... (all under the lease space's one hash tag)
-- ARGV: the default tier
-- Reply: one tier per key.

local reply = {}
for i, key in ipairs(KEYS) do
  redis.call("SET", key, ARGV[1], "NX")
  reply[i] = redis.call("GET", key)
end
return reply
