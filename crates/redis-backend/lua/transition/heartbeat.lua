-- transition.lua, part: mode heartbeat_batch
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV (from `base`): groups of stream, entry_id, delivery_count, unit_id,
-- `count` of them. The same result as `count` heartbeat calls in order, in
-- one call: each item is fenced on its own, the renewed entries are claimed
-- (idle time reset) with one XCLAIM per stream, the worker record and the
-- TTLs are written once. Reply: one status per delivery ("OK" or "STALE";
-- "CORRUPT" for each when the range keys were lost, see ranges.lua).
local function heartbeat_batch(m, count, base)
  count = tonumber(count)
  local reply = {}
  local claims = { [units] = {}, [priority] = {} }
  local current = nil
  -- Items on a range (ranges.lua): a range whose live units the call names
  -- all keeps one clock, which the beat resets; one named in part is
  -- exploded first, and its items are beaten as pending rows below.
  local in_range, fenced_in_range, named, named_ranges = {}, {}, {}, {}
  for i = 1, count do
    local b = base + (i - 1) * 4
    local index = ARGV[b] == "units" and index_of(ARGV[b + 1])
    local range = index and range_of(index)
    if range then
      in_range[i] = range
      local set = named[range]
      if not set then
        set = { n = 0 }
        named[range] = set
        named_ranges[#named_ranges + 1] = range
      end
      if range.owner == worker_id and range.count == tonumber(ARGV[b + 2]) and live_in(range, index)
          and unit_at_is(index, ARGV[b + 3]) then
        fenced_in_range[i] = true
        if not set[index] then
          set[index] = true
          set.n = set.n + 1
        end
      end
    end
  end
  if ranges_lost then
    return all_corrupt(count)
  end
  for _, range in ipairs(named_ranges) do
    if named[range].n == range.live then
      redis.call("ZADD", clocks, "XX", now, range.first)
    else
      explode(range)
    end
  end
  for i = 1, count do
    local b = base + (i - 1) * 4
    local stream = stream_key(ARGV[b])
    local unit_id = ARGV[b + 3]
    local range = in_range[i]
    if range and not range.gone then
      if fenced_in_range[i] then
        current = unit_id
        reply[i] = "OK"
      else
        reply[i] = "STALE"
      end
    elseif stream and fence(stream, ARGV[b + 1], ARGV[b + 2], unit_id) then
      local ids = claims[stream]
      ids[#ids + 1] = ARGV[b + 1]
      current = unit_id
      reply[i] = "OK"
    else
      reply[i] = "STALE"
    end
  end
  if not current then
    return reply
  end
  for stream, ids in pairs(claims) do
    for first = 1, #ids, 512 do
      local args = { "XCLAIM", stream, GROUP, worker_id, 0 }
      for k = first, math.min(first + 511, #ids) do
        args[#args + 1] = ids[k]
      end
      args[#args + 1] = "JUSTID"
      redis.call(unpack(args))
    end
  end
  touch_worker(jstr(current))
  renew_ttls(m.ttl_ms)
  return reply
end
