-- Deregisters a key and drops its lease and tier so its owner stops (fencing).
-- The fence counter stays, so later tokens keep increasing.
--
-- KEYS: sync:live, sync:lease:{id}, sync:tier:{id}
-- ARGV: id

redis.call("SREM", KEYS[1], ARGV[1])
redis.call("DEL", KEYS[2], KEYS[3])
return 1
