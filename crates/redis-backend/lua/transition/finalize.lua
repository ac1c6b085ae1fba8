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
  local spans = { [units] = {}, [priority] = {} }
  local r = tonumber(ARGV[base])
  for k = 1, r do
    local b = base + 1 + (k - 1) * 4
    local stream = stream_key(ARGV[b])
    if stream then
      local list = spans[stream]
      list[#list + 1] = { ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3]) }
    end
  end
  base = base + 1 + r * 4
  -- Parallel arrays (a table per item costs more than its fields), and one
  -- hash insert per entry: pos[stream][entry_id] = the first item naming it.
  -- Lookups are by that first item's index (array parts, no string keys).
  -- A main-stream item still in a range (ranges.lua) is fenced by its range
  -- instead: in_range[i] is that range, at[i] the unit's index.
  local i_stream, i_id, i_dc, i_unit, first = {}, {}, {}, {}, {}
  local in_range, at = {}, {}
  local pos = { [units] = {}, [priority] = {} }
  -- The indexes of the main-stream items not in a range (they read spans).
  local main_rows = {}
  for i = 1, count do
    local b = base + (i - 1) * 5
    local stream = stream_key(ARGV[b])
    local entry_id = ARGV[b + 1]
    i_stream[i] = stream or false
    i_id[i] = entry_id
    i_dc[i] = tonumber(ARGV[b + 2])
    i_unit[i] = ARGV[b + 3]
    first[i] = false
    local index = stream == units and index_of(entry_id)
    local range = index and range_of(index)
    if range then
      in_range[i], at[i] = range, index
    elseif stream then
      if index then
        main_rows[#main_rows + 1] = index
      end
      local p = pos[stream]
      local f = p[entry_id]
      if not f then
        f = i
        p[entry_id] = i
      end
      first[i] = f
    end
  end

  -- The fence rows: dc_of[f] = the delivery count pending on this worker (or
  -- false), unit_of[f] = the unit of the entry (or false). The client's spans
  -- ({ lo, hi, n }) are hints only: every id is matched exactly, an entry
  -- of a span that is not the batch's is passed over, and an entry the range
  -- reads miss is looked up on its own. A batch is a few spans (each reserve
  -- call delivers adjacent entries), so this is a few range reads. A span of
  -- the main stream that holds no item outside a range is not read.
  local function span_needed(stream, lo, hi)
    if stream ~= units then
      return true
    end
    local lo_index, hi_index = index_of(lo), index_of(hi)
    if not lo_index or not hi_index then
      return true
    end
    for _, index in ipairs(main_rows) do
      if index >= lo_index and index <= hi_index then
        return true
      end
    end
    return false
  end
  local dc_of, unit_of, group_of = {}, {}, {}
  for _, stream in ipairs({ units, priority }) do
    local p = pos[stream]
    for _, span in ipairs(spans[stream]) do
      local lo, hi, n = span[1], span[2], span[3]
      if span_needed(stream, lo, hi) then
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
  end
  for i = 1, count do
    if first[i] == i then
      local stream, entry_id = i_stream[i], i_id[i]
      if dc_of[i] == nil then
        local row = pending_row(stream, entry_id)
        dc_of[i] = (row and row.consumer == worker_id) and row.delivery_count or false
      end
      if dc_of[i] and unit_of[i] == nil then
        local entry = redis.call("XRANGE", stream, entry_id, entry_id)
        if type(entry[1]) == "table" then
          local unit, _, _, _, group = entry_unit(entry[1][2])
          unit_of[i], group_of[i] = unit or false, group
        else
          unit_of[i] = false
        end
      end
    end
  end

  -- The fence, in order; an entry finalized earlier in the batch is STALE.
  local reply, passed, passed_units, used, used_index = {}, {}, {}, {}, {}
  for i = 1, count do
    local f = first[i]
    local range, index = in_range[i], at[i]
    local ok
    if range then
      ok = not used_index[index] and range.owner == worker_id and range.count == i_dc[i] and live_in(range, index)
        and unit_at_is(index, i_unit[i])
      used_index[index] = used_index[index] or ok
    else
      ok = f and not used[f] and dc_of[f] == i_dc[i] and unit_of[f] == i_unit[i]
      if ok then
        used[f] = true
      end
    end
    if ok then
      passed[#passed + 1] = i
      passed_units[#passed_units + 1] = i_unit[i]
      reply[i] = "OK"
    else
      reply[i] = "STALE"
    end
  end

  if ranges_lost then
    -- A main-stream item may be in a lost range: nothing is written.
    return all_corrupt(count)
  end

  local states = read_states(passed_units)
  local acks = {}
  -- Per range finalized in: the offsets of its units this call finished.
  local finished, finished_ranges = {}, {}
  local done, failed = 0, 0
  for j, i in ipairs(passed) do
    local state = states[j]
    if not state then
      reply[i] = "CORRUPT"
    else
      local range = in_range[i]
      if range then
        local offsets = finished[range]
        if not offsets then
          offsets = {}
          finished[range] = offsets
          finished_ranges[#finished_ranges + 1] = range
        end
        offsets[#offsets + 1] = at[i] - range.first + 1
      else
        local stream = i_stream[i]
        local ids = acks[stream]
        if not ids then
          ids = {}
          acks[stream] = ids
        end
        ids[#ids + 1] = i_id[i]
      end
      local tail = ARGV[base + (i - 1) * 5 + 4]
      append_finalized(i_unit[i], state, tail)
      done = done + 1
      -- The client builds the tail with the outcome first.
      if string.sub(tail, 1, 19) == ',"outcome":"failed"' and not state.quarantined then
        failed = failed + 1
      end
    end
  end
  for _, range in ipairs(finished_ranges) do
    finish_in_range(range, finished[range])
  end
  for stream, ids in pairs(acks) do
    for k = 1, #ids, 512 do
      redis.call("XACK", stream, GROUP, unpack(ids, k, math.min(k + 511, #ids)))
    end
  end
  if has_groups then
    for j, i in ipairs(passed) do
      if states[j] and first[i] then
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
