-- Deletes a lease only while it is still the exact lease given.
--
-- KEYS: sync:lease:{id}
-- ARGV: "owner token"
-- Reply: 1 when released, 0 otherwise.

if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
