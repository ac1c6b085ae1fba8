-- Records the key space's bucket count once; answers the recorded one.
--
-- KEYS: sync:buckets:meta
-- ARGV: count

redis.call("HSETNX", KEYS[1], "count", ARGV[1])
return redis.call("HGET", KEYS[1], "count")
