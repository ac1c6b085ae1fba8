-- Adds to or sets bucket weights, keeping the total (meta's "total") equal
-- to their sum. A bucket that gains weight joins the pool of claimable
-- buckets (score 0) unless it is in it already; one that drops to 0 and has
-- no owner leaves it.
--
-- Each bucket's change count (versions) counts up.
--
-- In "add" mode each bucket is also published on the change channel (a
-- notice for its owner; in a cluster, PUBLISH reaches every node).
--
-- KEYS: sync:buckets:meta, :weights, :owners, :expiry, :versions
-- ARGV: mode ("add" or "set"), the change channel, then pairs of bucket, value
-- Reply: each bucket's new weight.

local meta, weights, owners, expiry, versions = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local add = ARGV[1] == "add"
local channel = ARGV[2]
local reply = {}
for i = 3, #ARGV, 2 do
  local bucket = ARGV[i]
  local old = tonumber(redis.call("HGET", weights, bucket) or "0")
  local new = tonumber(ARGV[i + 1])
  if add then
    new = math.max(0, old + new)
  end
  redis.call("HINCRBY", versions, bucket, 1)
  redis.call("HINCRBY", meta, "total", new - old)
  if new == 0 then
    redis.call("HDEL", weights, bucket)
    if redis.call("HEXISTS", owners, bucket) == 0 then
      redis.call("ZREM", expiry, bucket)
    end
  else
    redis.call("HSET", weights, bucket, new)
    redis.call("ZADD", expiry, "NX", 0, bucket)
  end
  reply[#reply + 1] = new
  if add then
    redis.call("PUBLISH", channel, bucket)
  end
end
return reply
