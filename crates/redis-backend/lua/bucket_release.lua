-- Releases bucket leases that are still current (back to the pool when the
-- bucket has weight), and with a worker name also forgets that worker.
--
-- KEYS: sync:buckets:weights, :owners, :expiry, :workers, :loads
-- ARGV: worker to forget ("" for none), then triples of bucket, owner, token
-- Reply: 1|0 per lease: released, or no longer current.

local weights, owners, expiry, workers, loads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {}
for i = 2, #ARGV, 3 do
  local bucket = ARGV[i]
  local at = redis.call("ZSCORE", expiry, bucket)
  if at and tonumber(at) >= now and redis.call("HGET", owners, bucket) == ARGV[i + 1] .. " " .. ARGV[i + 2] then
    redis.call("HDEL", owners, bucket)
    if tonumber(redis.call("HGET", weights, bucket) or "0") > 0 then
      redis.call("ZADD", expiry, 0, bucket)
    else
      redis.call("ZREM", expiry, bucket)
    end
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
if ARGV[1] ~= "" then
  redis.call("ZREM", workers, ARGV[1])
  redis.call("ZREM", loads, ARGV[1])
end
return reply
