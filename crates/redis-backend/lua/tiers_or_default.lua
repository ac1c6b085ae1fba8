-- The tier of each key, first setting the default on those with none.
-- One MGET, then a write only for the keys without a tier: a takeover reads
-- the tiers of thousands of accounts that nearly all have one.
--
-- KEYS: sync:tier:{id}... (all under the lease space's one hash tag)
-- ARGV: the default tier
-- Reply: one tier per key.

local reply = redis.call("MGET", unpack(KEYS))
for i, key in ipairs(KEYS) do
  if not reply[i] then
    redis.call("SET", key, ARGV[1])
    reply[i] = ARGV[1]
  end
end
return reply
