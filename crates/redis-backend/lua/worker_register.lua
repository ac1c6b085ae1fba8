-- Registers (or refreshes) a worker for ttl_ms: the seed's sync:workers:{id}
-- key with a TTL, plus an index sorted by expiry so live workers can be
-- listed without scanning the keyspace.
--
-- KEYS: sync:workers:{id}, sync:workers (index)
-- ARGV: id, ttl_ms

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("SET", KEYS[1], "1", "PX", ARGV[2])
redis.call("ZADD", KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now)
return 1
