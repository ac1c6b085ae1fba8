-- transition.lua, part: mode finalize_batch
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV (from `base`): the number of spans of nearby entries
-- of the batch, then per span its stream, lowest id, highest id and the most
-- entries it can hold (hints for the fence reads); then `count` groups of stream, entry_id, delivery_count,
-- unit_id, tail: the client-built rest of the finalized event after its
-- header (',"outcome":...,"entry_id":"..."}'), none of it decided here.
-- The same result as `count` finalize calls in order, in one call.
-- Reply: one status per delivery ("OK", "STALE" or "CORRUPT").
local function finalize_batch(m, count, base)
  count = tonumber(count)
  local ranges = { [units] = {}, [priority] = {} }
  local r = tonumber(ARGV[base])
  for k = 1, r do
    local b = base + 1 + (k - 1) * 4
    local stream = stream_key(ARGV[b])
    if stream then
      local list = ranges[stream]
      list[#list + 1] = { ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3]) }
    end
  end
  base = base + 1 + r * 4
  -- Parallel arrays (a table per item costs more than its fields), and one
  -- hash insert per entry: pos[stream][entry_id] = the first item naming it.
  -- Lookups are by that first item's index (array parts, no string keys).
  local i_stream, i_id, i_dc, i_unit, first = {}, {}, {}, {}, {}
  local pos = { [units] = {}, [priority] = {} }
  for i = 1, count do
    local b = base + (i - 1) * 5
    local stream = stream_key(ARGV[b])
    local entry_id = ARGV[b + 1]
    i_stream[i] = stream or false
    i_id[i] = entry_id
    i_dc[i] = tonumber(ARGV[b + 2])
    i_unit[i] = ARGV[b + 3]
    if stream then
      local p = pos[stream]
      local f = p[entry_id]
      if not f then
        f = i
        p[entry_id] = i
      end
      first[i] = f
    else
      first[i] = false
    end
  end

  -- The fence rows: dc_of[f] = the delivery count pending on this worker (or
  -- false), unit_of[f] = the unit of the entry (or false). The client's spans
  -- ({ lo, hi, n }) are hints only: every id is matched exactly, an entry
  -- of a span that is not the batch's is passed over, and an entry the range
  -- reads miss is looked up on its own. A batch is a few spans (each reserve
  -- call delivers adjacent entries), so this is a few range reads.
  local dc_of, unit_of, group_of = {}, {}, {}
  for _, stream in ipairs({ units, priority }) do
    local p = pos[stream]
    for _, range in ipairs(ranges[stream]) do
      local lo, hi, n = range[1], range[2], range[3]
      for _, row in ipairs(redis.call("XPENDING", stream, GROUP, lo, hi, n, worker_id)) do
        local f = p[row[1]]
        if f then
          dc_of[f] = tonumber(row[4])
        end
      end
      for _, entry in ipairs(redis.call("XRANGE", stream, lo, hi, "COUNT", n)) do
        local f = p[entry[1]]
        if f then
          local unit, _, _, _, group = entry_unit(entry[2])
          unit_of[f], group_of[f] = unit or false, group
        end
      end
    end
  end
  for i = 1, count do
    if first[i] == i then
      local stream, entry_id = i_stream[i], i_id[i]
      if dc_of[i] == nil then
        local row = pending_row(stream, entry_id)
        dc_of[i] = (row and row.consumer == worker_id) and row.delivery_count or false
      end
      if dc_of[i] and unit_of[i] == nil then
        local range = redis.call("XRANGE", stream, entry_id, entry_id)
        if type(range[1]) == "table" then
          local unit, _, _, _, group = entry_unit(range[1][2])
          unit_of[i], group_of[i] = unit or false, group
        else
          unit_of[i] = false
        end
      end
    end
  end

  -- The fence, in order; an entry finalized earlier in the batch is STALE.
  local reply, passed, passed_units, used = {}, {}, {}, {}
  for i = 1, count do
    local f = first[i]
    if f and not used[f] and dc_of[f] == i_dc[i] and unit_of[f] == i_unit[i] then
      used[f] = true
      passed[#passed + 1] = i
      passed_units[#passed_units + 1] = i_unit[i]
      reply[i] = "OK"
    else
      reply[i] = "STALE"
    end
  end

  local states = read_states(passed_units)
  local acks = {}
  local done, failed = 0, 0
  for j, i in ipairs(passed) do
    local state = states[j]
    if not state then
      reply[i] = "CORRUPT"
    else
      local stream = i_stream[i]
      local ids = acks[stream]
      if not ids then
        ids = {}
        acks[stream] = ids
      end
      ids[#ids + 1] = i_id[i]
      local tail = ARGV[base + (i - 1) * 5 + 4]
      append_finalized(i_unit[i], state, tail)
      done = done + 1
      -- The client builds the tail with the outcome first.
      if string.sub(tail, 1, 19) == ',"outcome":"failed"' and not state.quarantined then
        failed = failed + 1
      end
    end
  end
  for stream, ids in pairs(acks) do
    for first = 1, #ids, 512 do
      redis.call("XACK", stream, GROUP, unpack(ids, first, math.min(first + 511, #ids)))
    end
  end
  if has_groups then
    for j, i in ipairs(passed) do
      if states[j] then
        group_freed(group_of[first[i]])
      end
    end
  end
  if done > 0 then
    redis.call("HINCRBY", meta, "finalized_count", done)
    if failed > 0 then
      redis.call("HINCRBY", meta, "failed_count", failed)
    end
    touch_worker("null", done)
    renew_ttls(m.ttl_ms)
  end
  return reply
end
