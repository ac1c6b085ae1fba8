-- Raises one bucket's fence counter to at least `past` (never lowers it).
--
-- KEYS: sync:buckets:fences
-- ARGV: bucket, past
-- Reply: the counter after.

local current = tonumber(redis.call("HGET", KEYS[1], ARGV[1]) or "0")
local past = tonumber(ARGV[2])
if current < past then
  redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
  return past
end
return current
