-- Records the key space's bucket count once; answers the recorded one, and
-- 1 when this call recorded it (a new key space, or one that lost its data).
--
-- KEYS: sync:buckets:meta
-- ARGV: count
-- Reply: {count, 1|0}

local recorded = redis.call("HSETNX", KEYS[1], "count", ARGV[1])
return { redis.call("HGET", KEYS[1], "count"), recorded }
