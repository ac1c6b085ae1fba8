-- Raises a key's fence counter so that its next claim's token (INCR of the
-- counter, in lease_claim.lua) is above a token downstream storage holds.
--
-- KEYS: sync:fence:{id} (under the lease space's one hash tag)
-- ARGV: past (a token; the counter becomes at least this)
-- Reply: the counter afterwards.
--
-- Only ever raises: a counter at or above `past` is left alone, so two
-- workers repairing the same key at once cannot move it back. The lease
-- itself is not touched: its holder keeps it until renew or release.

local past = tonumber(ARGV[1])
local current = tonumber(redis.call("GET", KEYS[1]) or "0")
if current < past then
  redis.call("SET", KEYS[1], ARGV[1])
  return past
end
return current
