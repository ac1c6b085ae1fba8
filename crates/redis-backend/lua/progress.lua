-- A consistent snapshot of a run's counters.
--
-- KEYS: units, units:priority, meta, parked
-- Reply: false when the run does not exist, else
--        { total, finalized, requeued_units, in_flight, queued, failed, stopped (0/1) }
-- A run without max_failures (none set, or stored before it existed) never stops.

local units, priority, meta, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local m = redis.call("HMGET", meta, "total_units", "finalized_count", "requeued_units_count", "failed_count",
  "max_failures", "cursor", "range_live")
if not m[1] then
  return false
end

-- Pending and not-yet-delivered counts of the "workers" group of one stream.
local function group_counts(stream)
  if redis.call("EXISTS", stream) == 0 then
    return 0, 0
  end
  local pending, lag, last_id = 0, nil, "0-0"
  for _, group in ipairs(redis.call("XINFO", "GROUPS", stream)) do
    local f = {}
    for i = 1, #group, 2 do
      f[group[i]] = group[i + 1]
    end
    if f["name"] == "workers" then
      pending = tonumber(f["pending"]) or 0
      lag = tonumber(f["lag"])
      last_id = f["last-delivered-id"] or "0-0"
    end
  end
  if not lag then
    -- Redis cannot tell the lag (entries deleted): count what follows the cursor.
    lag = #redis.call("XRANGE", stream, "(" .. last_id, "+")
  end
  return pending, lag
end

local p_pending, p_queued = group_counts(priority)
local u_pending, u_queued = group_counts(units)
-- The main queue (format 5): the units behind the cursor are queued, and
-- the live units of ranges are pending besides the stream's own rows.
local cursor = tonumber(m[6])
if cursor then
  u_queued = tonumber(m[1]) - cursor
  u_pending = u_pending + (tonumber(m[7]) or 0)
end
local failed, max_failures = tonumber(m[4]) or 0, tonumber(m[5])
local stopped = 0
if max_failures and failed >= max_failures then
  stopped = 1
end
-- Entries waiting for a place in their group are queued too.
local waiting = redis.call("ZCARD", parked)
return { tonumber(m[1]), tonumber(m[2]) or 0, tonumber(m[3]) or 0, p_pending + u_pending, p_queued + u_queued + waiting, failed,
  stopped }
