-- Extends a lease only while it is still the exact lease given.
--
-- KEYS: sync:lease:{id}
-- ARGV: "owner token", ttl_ms
-- Reply: 1 when renewed, 0 otherwise (taken over, expired, dropped).

if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
