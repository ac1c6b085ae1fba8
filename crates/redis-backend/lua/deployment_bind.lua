-- Binds the key space to one deployment: records the given id unless one is
-- recorded, and answers the recorded one.
--
-- KEYS: sync:deployment (under the lease space's one hash tag)
-- ARGV: deployment id
-- Reply: the recorded id (the given one when this call recorded it).
--
-- No TTL: the binding lasts as long as the key space. A Redis that comes
-- back empty is bound again by the first worker to start or reconcile.

redis.call("SET", KEYS[1], ARGV[1], "NX")
return redis.call("GET", KEYS[1])
