-- The current lease of one bucket: "owner token", or false.
--
-- KEYS: sync:buckets:owners, :expiry
-- ARGV: bucket

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = redis.call("ZSCORE", KEYS[2], ARGV[1])
if not at or tonumber(at) < now then
  return false
end
return redis.call("HGET", KEYS[1], ARGV[1])
