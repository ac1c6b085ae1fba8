-- transition.lua, part: modes finalize and finalize_batch
-- (The parts are joined in order in src/scripts.rs.)

-- Fence lookups for many entries of one stream: { [entry_id] = delivery_count
-- or false } of this worker's pending entries and { [entry_id] = unit or
-- false } of the stream. `ranges` are the client's runs of adjacent entries
-- of the batch ({ lo, hi, n }): hints only, every id is matched exactly, and
-- an id the range reads miss is looked up on its own. A batch is a few runs
-- (each reserve call delivers adjacent entries), so the lookups are a few
-- range reads that return only the batch's entries.
local function fence_tables(stream, ids, ranges)
  local counts, units_of = {}, {}
  for _, range in ipairs(ranges) do
    local lo, hi, n = range[1], range[2], range[3]
    for _, row in ipairs(redis.call("XPENDING", stream, GROUP, lo, hi, n, worker_id)) do
      counts[row[1]] = tonumber(row[4])
    end
    for _, entry in ipairs(redis.call("XRANGE", stream, lo, hi, "COUNT", n)) do
      units_of[entry[1]] = entry_unit(entry[2])
    end
  end
  for _, id in ipairs(ids) do
    if counts[id] == nil then
      local row = pending_row(stream, id)
      counts[id] = (row and row.consumer == worker_id) and row.delivery_count or false
    end
    if counts[id] and units_of[id] == nil then
      local range = redis.call("XRANGE", stream, id, id)
      if type(range[1]) == "table" then
        units_of[id] = entry_unit(range[1][2])
      else
        units_of[id] = false
      end
    end
  end
  return counts, units_of
end

-- ARGV (from `base`): with `hinted`, the number of runs of adjacent entries
-- of the batch, then per run its stream, lowest id, highest id and length
-- (hints for fence_tables); then `count` groups of stream, entry_id, delivery_count,
-- unit_id, tail: the client-built rest of the finalized event after its
-- header (',"outcome":...,"entry_id":"..."}'), none of it decided here.
-- The same result as `count` finalize calls in order, in one call.
-- Reply: one status per delivery ("OK", "STALE" or "CORRUPT").
-- Without hints (a single finalize) the items start at `base`.
local function finalize_batch(m, count, base, hinted)
  count = tonumber(count)
  local ranges = { [units] = {}, [priority] = {} }
  if hinted then
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
  end
  -- Parallel arrays (a table per item costs more than its fields).
  local i_stream, i_id, i_dc, i_unit = {}, {}, {}, {}
  local by_stream = {}
  for i = 1, count do
    local b = base + (i - 1) * 5
    local stream = stream_key(ARGV[b])
    local entry_id = ARGV[b + 1]
    i_stream[i] = stream or false
    i_id[i] = entry_id
    i_dc[i] = tonumber(ARGV[b + 2])
    i_unit[i] = ARGV[b + 3]
    if stream then
      local ids = by_stream[stream]
      if not ids then
        ids = {}
        by_stream[stream] = ids
      end
      ids[#ids + 1] = entry_id
    end
  end
  local tables = {}
  for stream, ids in pairs(by_stream) do
    local counts, units_of = fence_tables(stream, ids, ranges[stream])
    tables[stream] = { counts = counts, units = units_of, seen = {} }
  end

  -- The fence, in order; an entry finalized earlier in the batch is STALE.
  local reply, passed, passed_units = {}, {}, {}
  for i = 1, count do
    local stream, entry_id = i_stream[i], i_id[i]
    local t = stream and tables[stream]
    if t and not t.seen[entry_id] and t.counts[entry_id] == i_dc[i] and t.units[entry_id] == i_unit[i] then
      t.seen[entry_id] = true
      passed[#passed + 1] = i
      passed_units[#passed_units + 1] = i_unit[i]
      reply[i] = "OK"
    else
      reply[i] = "STALE"
    end
  end

  local states = read_states(passed_units)
  local acks = {}
  local done = 0
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
      local prefix, suffix = event_head_parts("finalized", state)
      event_begin()
      local n = ev_n + 1
      ev_parts[n] = prefix
      n = put_unit_json(n, i_unit[i])
      ev_parts[n + 1] = suffix
      ev_parts[n + 2] = ARGV[base + (i - 1) * 5 + 4]
      ev_n = n + 2
      done = done + 1
    end
  end
  for stream, ids in pairs(acks) do
    for first = 1, #ids, 512 do
      redis.call("XACK", stream, GROUP, unpack(ids, first, math.min(first + 511, #ids)))
    end
  end
  if done > 0 then
    redis.call("HINCRBY", meta, "finalized_count", done)
    touch_worker("null", done)
    renew_ttls(m.ttl_ms)
  end
  return reply
end
