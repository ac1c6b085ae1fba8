-- One worker's balancing step (leasehold_core::BucketLeases::tick; the
-- memory backend's buckets.rs is the reference, BalancePolicy's docs the
-- rules). Its cost is the held leases, at most max_claims free entries and
-- the workers that died since: nothing here reads every bucket.
--
-- KEYS: sync:buckets:meta, :weights, :fences, :owners, :expiry, :workers, :loads, :versions
-- ARGV: owner, ttl_ms, slack_pct, max_claims, max_sheds, then pairs of
--       bucket, token (the leases the owner believes it holds)
-- Reply: { {workers, total, load, cap}, {1|0 per held lease: kept or lost},
--          {bucket, token, ... claimed}, {bucket, ... to shed},
--          {change count of each kept, then each claimed bucket},
--          {ms until the soonest running lease runs out} or {} if none }
--
-- owners: bucket -> "owner token"; expiry: bucket -> ms the lease runs out
-- (0 for a free bucket; only buckets with weight or an owner are members);
-- workers: worker -> ms its registration runs out; loads: worker -> load at
-- its last tick; fences: bucket -> last token (never expires).

local meta, weights, fences, owners, expiry, workers, loads, versions =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local slack, max_claims, max_sheds = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = now + ttl

redis.call("ZADD", workers, ends, owner)
for _, dead in ipairs(redis.call("ZRANGEBYSCORE", workers, "-inf", "(" .. now)) do
  redis.call("ZREM", workers, dead)
  redis.call("ZREM", loads, dead)
end

local function weight(bucket)
  return tonumber(redis.call("HGET", weights, bucket) or "0")
end

local load, kept, flags, order = 0, {}, {}, {}
for i = 6, #ARGV, 2 do
  local bucket, token = ARGV[i], ARGV[i + 1]
  local at = redis.call("ZSCORE", expiry, bucket)
  if at and tonumber(at) >= now and redis.call("HGET", owners, bucket) == owner .. " " .. token then
    redis.call("ZADD", expiry, ends, bucket)
    local w = weight(bucket)
    load = load + w
    kept[#kept + 1] = { tonumber(bucket), w }
    order[#order + 1] = bucket
    flags[#flags + 1] = 1
  else
    flags[#flags + 1] = 0
  end
end

local n = redis.call("ZCARD", workers)
local total = tonumber(redis.call("HGET", meta, "total") or "0")
local cap = math.floor(((100 + slack) * total + 100 * n - 1) / (100 * n))
local claimed, shed = {}, {}

if load * n < total then
  local free = redis.call("ZRANGEBYSCORE", expiry, "-inf", "(" .. now, "LIMIT", 0, max_claims)
  for _, bucket in ipairs(free) do
    local w = weight(bucket)
    if w == 0 then
      redis.call("HDEL", owners, bucket)
      redis.call("ZREM", expiry, bucket)
    else
      if load * n >= total then
        break
      end
      if not (load > 0 and load + w > cap) then
        local token = redis.call("HINCRBY", fences, bucket, 1)
        redis.call("HSET", owners, bucket, owner .. " " .. token)
        redis.call("ZADD", expiry, ends, bucket)
        load = load + w
        claimed[#claimed + 1] = tonumber(bucket)
        claimed[#claimed + 1] = token
        order[#order + 1] = bucket
      end
    end
  end
else
  local least = nil
  local lows = redis.call("ZRANGE", loads, 0, 1, "WITHSCORES")
  for i = 1, #lows, 2 do
    if lows[i] ~= owner then
      least = tonumber(lows[i + 1])
      break
    end
  end
  if least then
    -- Heaviest first, ties by bucket number (as BalancePolicy::sheds).
    table.sort(kept, function(a, b)
      if a[2] ~= b[2] then
        return a[2] > b[2]
      end
      return a[1] < b[1]
    end)
    local taken = {}
    local function pick(fits)
      for i, entry in ipairs(kept) do
        if not taken[i] and fits(entry[2]) then
          taken[i] = true
          shed[#shed + 1] = entry[1]
          return entry[2]
        end
      end
      return nil
    end
    while load > cap do
      local w = pick(function(w) return w <= load and (load - w) * n >= total end)
      if not w then
        break
      end
      load = load - w
    end
    local gap = math.max(0, load - least)
    local fine = 0
    while fine < max_sheds and load * n > total do
      local w = pick(function(w) return w > 0 and 2 * w <= gap and (load - w) * n >= total end)
      if not w then
        break
      end
      load = load - w
      gap = gap - 2 * w
      fine = fine + 1
    end
  end
end

redis.call("ZADD", loads, load, owner)
local changes = {}
for i, bucket in ipairs(order) do
  changes[i] = tonumber(redis.call("HGET", versions, bucket) or "0")
end
local soonest = {}
local next_out = redis.call("ZRANGEBYSCORE", expiry, now, "+inf", "WITHSCORES", "LIMIT", 0, 1)
if next_out[2] then
  soonest[1] = tonumber(next_out[2]) - now
end
return { { n, total, load, cap }, flags, claimed, shed, changes, soonest }
