-- Refreshes a user's presence for grace_ms and publishes user.active.
--
-- KEYS: sess:active:{user}
-- ARGV: user, grace_ms, channel

redis.call("SET", KEYS[1], "1", "PX", ARGV[2])
redis.call("PUBLISH", ARGV[3], ARGV[1])
return 1
