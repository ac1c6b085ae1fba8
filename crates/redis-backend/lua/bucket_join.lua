-- Counts a worker as live for ttl_ms, holding nothing, without claiming
-- (BucketLeases::join): its load is 0 unless a tick recorded one.
--
-- KEYS: sync:buckets:workers, :loads
-- ARGV: owner, ttl_ms

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("ZADD", KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call("ZADD", KEYS[2], "NX", 0, ARGV[1])
return 1
