-- Claims leases: for each key, at most one holder; a fencing token that
-- strictly increases with every successful claim of that key.
--
-- KEYS: triples of sync:lease:{id}, sync:fence:{id}, sync:tier:{id}
--       (all under the lease space's one hash tag)
-- ARGV: owner, ttl_ms
-- Reply: one token per triple, 0 when the key is held.
--
-- The lease value is "owner token", so renew and release check both. The
-- fence counter has no TTL: tokens survive release and expiry (see the
-- key layout in src/keys.rs for why it must never expire). The tier
-- defaults to warm on claim unless one is set.

local owner, ttl_ms = ARGV[1], ARGV[2]
local reply = {}
for i = 1, #KEYS, 3 do
  local lease, fence, tier = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  if redis.call("EXISTS", lease) == 1 then
    reply[#reply + 1] = 0
  else
    local token = redis.call("INCR", fence)
    redis.call("SET", lease, owner .. " " .. token, "PX", ttl_ms)
    redis.call("SET", tier, "warm", "NX")
    reply[#reply + 1] = token
  end
end
return reply
