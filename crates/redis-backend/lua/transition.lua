-- State transitions of one run of the fenced unit queue. One dispatcher, one
-- function per mode; modelled on rspec-hopper's transition.lua (the seed).
--
-- KEYS: units, units:priority, attempts, meta, unit_state, workers
--       (all share the run's hash tag)
-- ARGV: mode, worker_id, then mode-specific arguments (see dispatch).
--
-- Replies are arrays whose first element is a status string: "OK", "NONE",
-- "FINALIZED", "REQUEUED", "STALE" (fence failed) or "CORRUPT" (meta or the
-- unit's unit_state entry is missing or unreadable). STALE and CORRUPT are
-- status replies, not Lua errors, so the caller can tell them from Redis errors.
--
-- Differences from the seed, all for speed or exactness:
-- * `reserve` reads the priority stream, then the main stream, then reclaims,
--   all in one call, for up to `max` units (a batch), with the delivery
--   accounting (events, worker record) of every unit included.
-- * Reclaim takes the OLDEST pending entry idle for at least the timeout
--   (XPENDING ... IDLE, then XCLAIM), however many busy entries precede it;
--   the seed's XAUTOCLAIM ... COUNT 1 only looked at 10 PEL entries.
-- * No cjson in the hot path: unit state and worker records keep the seed's
--   JSON shape but are read with anchored patterns and written with
--   string.format; free text (summaries, errors) arrives pre-encoded as JSON.
-- * Budgets and the inactivity TTL come from meta (frozen at initialisation).
-- * `release_batch` is new: a worker hands deliveries back (shutting down,
--   prefetched units) without spending a retry or reclaim budget; the seed
--   could only abandon them to the reclaim timeout, which costs a reclaim.

local units, priority, attempts, meta, unit_state, workers =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local mode, worker_id = ARGV[1], ARGV[2]

local GROUP = "workers"
local STALE, CORRUPT = { "STALE" }, { "CORRUPT" }

local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- ---------------------------------------------------------------------------
-- Small helpers
-- ---------------------------------------------------------------------------

local function escape_char(c)
  if c == '"' then
    return '\\"'
  elseif c == "\\" then
    return "\\\\"
  end
  return string.format("\\u%04x", string.byte(c))
end

-- A Lua string as a JSON string literal.
local function jstr(s)
  if string.find(s, '[%c"\\]') then
    s = string.gsub(s, '[%c"\\]', escape_char)
  end
  return '"' .. s .. '"'
end

-- Raw JSON from the client, or null when empty.
local function raw_or_null(json)
  if json == nil or json == "" then
    return "null"
  end
  return json
end

local worker_json = jstr(worker_id)

local function stream_key(short)
  if short == "units" then
    return units
  elseif short == "units:priority" then
    return priority
  end
  return nil
end

local function stream_short(key)
  if key == units then
    return "units"
  end
  return "units:priority"
end

-- Meta fields every transition needs, in one call. nil when the run is gone.
local function read_meta()
  local m = redis.call("HMGET", meta, "ttl_ms", "max_requeues", "requeue_tolerance", "max_reclaims",
    "total_units", "requeued_units_count")
  local ttl = tonumber(m[1])
  if not ttl then
    return nil
  end
  return {
    ttl_ms = ttl,
    max_requeues = tonumber(m[2]) or 0,
    requeue_tolerance = tonumber(m[3]) or 0,
    max_reclaims = tonumber(m[4]) or 0,
    total_units = tonumber(m[5]) or 0,
    requeued_units = tonumber(m[6]) or 0,
  }
end

-- Renews the inactivity TTL of every key of the run (PEXPIRE skips absent keys).
-- Appends the call's events (defined with the event helpers below).
local flush_events

-- Appends the call's events first, so a newly created attempts stream gets
-- its TTL too.
local function renew_ttls(ttl_ms)
  flush_events()
  redis.call("PEXPIRE", units, ttl_ms)
  redis.call("PEXPIRE", priority, ttl_ms)
  redis.call("PEXPIRE", attempts, ttl_ms)
  redis.call("PEXPIRE", meta, ttl_ms)
  redis.call("PEXPIRE", unit_state, ttl_ms)
  redis.call("PEXPIRE", workers, ttl_ms)
end

-- The pending row of one entry: {consumer, delivery_count} or nil.
local function pending_row(stream, entry_id)
  local rows = redis.call("XPENDING", stream, GROUP, entry_id, entry_id, 1)
  local row = rows[1]
  if type(row) ~= "table" then
    return nil
  end
  return { consumer = row[2], delivery_count = tonumber(row[4]) }
end

-- Stream entry fields ({"id", unit, "type", kind}) as unit, kind.
local function entry_unit(fields)
  if fields[1] == "id" and fields[3] == "type" then
    return fields[2], fields[4]
  end
  local unit, kind
  for i = 1, #fields, 2 do
    if fields[i] == "id" then
      unit = fields[i + 1]
    elseif fields[i] == "type" then
      kind = fields[i + 1]
    end
  end
  return unit, kind or ""
end

-- The fence: the entry is still pending on worker_id at delivery_count, and
-- it is the caller's unit (a handle naming another unit is not the caller's).
local function fence(stream, entry_id, delivery_count, unit_id)
  local row = pending_row(stream, entry_id)
  if not row or row.consumer ~= worker_id or row.delivery_count ~= tonumber(delivery_count) then
    return nil
  end
  local range = redis.call("XRANGE", stream, entry_id, entry_id)
  if type(range[1]) ~= "table" then
    return nil
  end
  local unit, kind = entry_unit(range[1][2])
  if unit ~= unit_id then
    return nil
  end
  row.kind = kind
  return row
end

-- The unit's state, or nil when it is missing or unreadable (CORRUPT).
local function read_state(unit_id)
  local raw = redis.call("HGET", unit_state, unit_id)
  if not raw then
    return nil
  end
  local r, c, e = string.match(raw, '^{"retry_index":(%d+),"reclaim_count":(%d+),"entered_retry":(%a+)}$')
  if not r or (e ~= "true" and e ~= "false") then
    return nil
  end
  return { retry_index = tonumber(r), reclaim_count = tonumber(c), entered_retry = (e == "true") }
end

local FRESH_RAW = '{"retry_index":0,"reclaim_count":0,"entered_retry":false}'
local FRESH_STATE = { retry_index = 0, reclaim_count = 0, entered_retry = false }

-- States of many units in one call: a list parallel to `unit_ids` (false
-- where missing or unreadable).
local function read_states(unit_ids)
  local out = {}
  local CHUNK = 512
  for first = 1, #unit_ids, CHUNK do
    local last = math.min(first + CHUNK - 1, #unit_ids)
    local raws = redis.call("HMGET", unit_state, unpack(unit_ids, first, last))
    for i = 1, #raws do
      local raw = raws[i]
      local state = false
      if raw == FRESH_RAW then
        -- Shared, read-only: batch paths never change a state.
        state = FRESH_STATE
      elseif raw then
        local r, c, e = string.match(raw, '^{"retry_index":(%d+),"reclaim_count":(%d+),"entered_retry":(%a+)}$')
        if r and (e == "true" or e == "false") then
          state = { retry_index = tonumber(r), reclaim_count = tonumber(c), entered_retry = (e == "true") }
        end
      end
      out[first + i - 1] = state
    end
  end
  return out
end

local function write_state(unit_id, state)
  redis.call("HSET", unit_state, unit_id, string.format(
    '{"retry_index":%d,"reclaim_count":%d,"entered_retry":%s}',
    state.retry_index, state.reclaim_count, tostring(state.entered_retry == true)))
end

-- The opening of a unit event (no closing brace): type and header fields.
-- Built by concatenating cached pieces: the per-type prefix and the
-- per-(retry_index, reclaim_count) suffix are made once per call.
local now_str = string.format("%d", now)
local head_prefix, head_suffix = {}, {}
local function event_head_parts(event_type, state)
  local prefix = head_prefix[event_type]
  if not prefix then
    prefix = '{"type":"' .. event_type .. '","unit_id":'
    head_prefix[event_type] = prefix
  end
  local r, c = state.retry_index, state.reclaim_count
  local k = r * 65536 + c
  local suffix = head_suffix[k]
  if not suffix then
    suffix = string.format(',"worker_id":%s,"retry_index":%d,"reclaim_count":%d,"ownership_generation":%d,"at_ms":%s',
      worker_json, r, c, 1 + r + c, now_str)
    head_suffix[k] = suffix
  end
  return prefix, suffix
end

local function event_head(event_type, unit_json, state)
  local prefix, suffix = event_head_parts(event_type, state)
  return prefix .. unit_json .. suffix
end

-- Events of this call, appended to the attempts stream by flush_events: one
-- event as a "json" entry, several as one "batch" entry (a JSON array, in
-- order; at most EVENTS_PER_ENTRY per entry). The reader numbers the events
-- of an entry <ms>-<seq> as EventId <ms>-<seq * 65536 + index>.
--
-- The events are kept as pieces (ev_parts[2..ev_n], "," between events) and
-- joined by one table.concat: this Lua hashes every byte of every string it
-- makes, so no per-event string is built.
local EVENTS_PER_ENTRY = 65536
local ev_parts, ev_n, ev_count = { "[" }, 1, 0

-- Starts an event: the caller then appends its pieces after ev_parts[ev_n].
local function event_begin()
  if ev_count >= EVENTS_PER_ENTRY then
    flush_events()
  end
  ev_count = ev_count + 1
  if ev_count > 1 then
    ev_n = ev_n + 1
    ev_parts[ev_n] = ","
  end
end

local function append_json(json)
  event_begin()
  ev_n = ev_n + 1
  ev_parts[ev_n] = json
end

flush_events = function()
  if ev_count == 1 then
    redis.call("XADD", attempts, "*", "json", table.concat(ev_parts, "", 2, ev_n))
  elseif ev_count > 1 then
    ev_n = ev_n + 1
    ev_parts[ev_n] = "]"
    redis.call("XADD", attempts, "*", "batch", table.concat(ev_parts, "", 1, ev_n))
  end
  ev_parts, ev_n, ev_count = { "[" }, 1, 0
end

-- Appends a unit's JSON string literal as pieces (no new string unless it
-- needs escaping).
local function put_unit_json(n, unit)
  if string.find(unit, '[%c"\\]') then
    ev_parts[n + 1] = jstr(unit)
    return n + 1
  end
  ev_parts[n + 1] = '"'
  ev_parts[n + 2] = unit
  ev_parts[n + 3] = '"'
  return n + 3
end

-- Merges into workers[worker_id]: last_seen = now; current_unit = `current`
-- (raw JSON: a string literal or null) unless nil; processed += delta.
local function touch_worker(current, delta)
  local raw = redis.call("HGET", workers, worker_id)
  local cur, processed = "null", 0
  if raw then
    local c, p = string.match(raw, '^{"last_seen":%d+,"current_unit":(.*),"processed":(%d+)}$')
    if c then
      cur, processed = c, tonumber(p)
    end
  end
  if current ~= nil then
    cur = current
  end
  redis.call("HSET", workers, worker_id, string.format(
    '{"last_seen":%d,"current_unit":%s,"processed":%d}', now, cur, processed + (delta or 0)))
end

-- Terminal transition shared by finalize, requeue (budget exhausted) and
-- reclaim (budget exhausted): XACK, finalized event, finalized_count += 1.
-- `extra` is raw JSON fields to append (",\"k\":v..."), or "".
local function finalize_entry(stream, entry_id, unit_json, state, outcome, duration_ms, reason_json, errors_json, extra)
  redis.call("XACK", stream, GROUP, entry_id)
  append_json(event_head("finalized", unit_json, state) .. string.format(
    ',"outcome":"%s","duration_ms":%d,"reason":%s,"errors":%s,"stream":"%s","entry_id":"%s"%s}',
    outcome, tonumber(duration_ms) or 0, raw_or_null(reason_json), raw_or_null(errors_json),
    stream_short(stream), entry_id, extra))
  redis.call("HINCRBY", meta, "finalized_count", 1)
end

-- ---------------------------------------------------------------------------
-- Modes
-- ---------------------------------------------------------------------------

-- ARGV: max, reclaim_after_ms, single ("1": stop after the first item).
-- Reply: { tail, item... } where tail is "FULL", "NONE" or "CORRUPT" and the
-- items follow flat (no table per item, cheaper to reply): "OK", stream,
-- entry_id, unit, kind, delivery_count, retry_index, reclaim_count, reclaimed
-- (0/1), previous_worker or false; or "FINALIZED", unit (reclaim budget
-- exhausted).
local function reserve(m, max, reclaim_after_ms, single)
  max = tonumber(max)
  reclaim_after_ms = tonumber(reclaim_after_ms)
  local reply = { "NONE" }
  local delivered = 0
  local changed = false
  local current = nil
  -- Entries handed out by this call, per stream. A long-running call must not
  -- reclaim what it has just delivered: their idle time starts now, as in the
  -- memory backend, even when the script itself runs past the timeout.
  local touched, touched_count = { [priority] = {}, [units] = {} }, { [priority] = 0, [units] = 0 }
  local function touch(stream, entry_id)
    touched[stream][entry_id] = true
    touched_count[stream] = touched_count[stream] + 1
  end

  -- Fresh entries: priority stream first, then main.
  for _, stream in ipairs({ priority, units }) do
    if delivered >= max then
      break
    end
    local read = redis.call("XREADGROUP", "GROUP", GROUP, worker_id, "COUNT", max - delivered, "STREAMS", stream, ">")
    if type(read) == "table" and type(read[1]) == "table" then
      local short = stream_short(stream)
      local entries = read[1][2]
      local ids, unit_list, kinds = {}, {}, {}
      for i, entry in ipairs(entries) do
        ids[i] = entry[1]
        unit_list[i], kinds[i] = entry_unit(entry[2])
        if not unit_list[i] then
          unit_list[i] = ""
        end
      end
      local states = read_states(unit_list)
      local seen_here = touched[stream]
      local mid = ',"stream":"' .. short .. '","entry_id":"'
      for i = 1, #entries do
        local unit, state = unit_list[i], states[i]
        if not state then
          reply[1] = "CORRUPT"
          if changed then
            touch_worker(current and jstr(current))
            renew_ttls(m.ttl_ms)
          end
          return reply
        end
        local prefix, suffix = event_head_parts("delivered", state)
        event_begin()
        local n = ev_n + 1
        ev_parts[n] = prefix
        n = put_unit_json(n, unit)
        ev_parts[n + 1] = suffix
        ev_parts[n + 2] = mid
        ev_parts[n + 3] = ids[i]
        ev_parts[n + 4] = '","delivery_count":1}'
        ev_n = n + 4
        local r = #reply
        reply[r + 1] = "OK"
        reply[r + 2] = short
        reply[r + 3] = ids[i]
        reply[r + 4] = unit
        reply[r + 5] = kinds[i]
        reply[r + 6] = 1
        reply[r + 7] = state.retry_index
        reply[r + 8] = state.reclaim_count
        reply[r + 9] = 0
        reply[r + 10] = false
        seen_here[ids[i]] = true
        delivered = delivered + 1
        changed = true
        current = unit
      end
      touched_count[stream] = touched_count[stream] + #entries
    end
  end

  -- Reclaim: the oldest entry idle for at least the timeout, priority first.
  local tail = "NONE"
  if delivered >= max then
    tail = "FULL"
  end
  while delivered < max do
    local stream, row
    for _, s in ipairs({ priority, units }) do
      local rows = redis.call("XPENDING", s, GROUP, "IDLE", reclaim_after_ms, "-", "+", touched_count[s] + 1)
      for _, candidate in ipairs(rows) do
        if type(candidate) == "table" and not touched[s][candidate[1]] then
          stream, row = s, candidate
          break
        end
      end
      if stream then
        break
      end
    end
    if not stream then
      tail = "NONE"
      break
    end
    local entry_id, previous = row[1], row[2]
    local range = redis.call("XRANGE", stream, entry_id, entry_id)
    local unit, kind
    if type(range[1]) == "table" then
      unit, kind = entry_unit(range[1][2])
    end
    -- Refuse before moving ownership when the unit's state is gone.
    local state = unit and read_state(unit)
    if not state then
      tail = "CORRUPT"
      break
    end
    redis.call("XCLAIM", stream, GROUP, worker_id, 0, entry_id)
    touch(stream, entry_id)
    local delivery_count = tonumber(row[4]) + 1
    local short = stream_short(stream)
    local unit_json = jstr(unit)
    changed = true
    if state.reclaim_count + 1 > m.max_reclaims then
      finalize_entry(stream, entry_id, unit_json, state, "failed", 0, '"reclaim_budget_exhausted"', "",
        string.format(',"previous_worker_id":%s,"delivery_count":%d', jstr(previous), delivery_count))
      reply[#reply + 1] = "FINALIZED"
      reply[#reply + 1] = unit
      if single == "1" then
        tail = "FULL"
        break
      end
    else
      state.reclaim_count = state.reclaim_count + 1
      write_state(unit, state)
      append_json(event_head("reclaimed", unit_json, state) .. string.format(
        ',"previous_worker_id":%s,"stream":"%s","entry_id":"%s","delivery_count":%d}',
        jstr(previous), short, entry_id, delivery_count))
      for _, v in ipairs({ "OK", short, entry_id, unit, kind, delivery_count, state.retry_index, state.reclaim_count, 1,
        previous or false }) do
        reply[#reply + 1] = v
      end
      delivered = delivered + 1
      current = unit
      if delivered >= max then
        tail = "FULL"
      end
    end
  end
  reply[1] = tail
  if changed then
    touch_worker(current and jstr(current))
    renew_ttls(m.ttl_ms)
  end
  return reply
end

-- The stream key and unit state of a fenced delivery; or nil and the reply
-- to return: STALE when the fence fails, CORRUPT when the unit's state is gone.
-- The third result is the fence's pending row (with the entry's kind).
local function fenced_state(short, entry_id, delivery_count, unit_id)
  local stream = stream_key(short)
  local row = stream and fence(stream, entry_id, delivery_count, unit_id)
  if not row then
    return nil, STALE
  end
  local state = read_state(unit_id)
  if not state then
    return nil, CORRUPT
  end
  return stream, state, row
end

-- ARGV: stream, entry_id, delivery_count, unit_id.
local function heartbeat(m, short, entry_id, delivery_count, unit_id)
  local stream = stream_key(short)
  if not stream or not fence(stream, entry_id, delivery_count, unit_id) then
    return STALE
  end
  redis.call("XCLAIM", stream, GROUP, worker_id, 0, entry_id, "JUSTID")
  touch_worker(jstr(unit_id))
  renew_ttls(m.ttl_ms)
  return { "OK" }
end

-- Fence lookups for many entries of one stream: { [entry_id] = delivery_count }
-- of this worker's pending entries and { [entry_id] = unit } of the stream,
-- in a few calls instead of two per entry.
local function fence_tables(stream, ids)
  local counts, units_of = {}, {}
  local scanned = {}
  if #ids <= 2 then
    for _, id in ipairs(ids) do
      local row = pending_row(stream, id)
      if row and row.consumer == worker_id then
        counts[id] = row.delivery_count
      end
    end
  else
    -- This worker's pending entries (normally exactly its batch).
    local limit = #ids * 2
    local rows = redis.call("XPENDING", stream, GROUP, "-", "+", limit, worker_id)
    scanned = rows
    for _, row in ipairs(rows) do
      counts[row[1]] = tonumber(row[4])
    end
    if #rows >= limit then
      -- More pending than the scan covered: look the rest up one by one.
      for _, id in ipairs(ids) do
        if not counts[id] then
          local row = pending_row(stream, id)
          if row and row.consumer == worker_id then
            counts[id] = row.delivery_count
          end
        end
      end
    end
  end
  -- Units of the entries: one XRANGE over their span when it is compact.
  -- The scan's rows are in id order: the span runs from the first wanted row
  -- to the last (entries found outside the scan are looked up one by one).
  local lo, hi
  if #ids > 2 then
    local wanted = {}
    for _, id in ipairs(ids) do
      wanted[id] = true
    end
    for _, row in ipairs(scanned) do
      if wanted[row[1]] then
        lo = lo or row[1]
        hi = row[1]
      end
    end
  end
  if lo then
    for _, entry in ipairs(redis.call("XRANGE", stream, lo, hi, "COUNT", #ids * 2)) do
      units_of[entry[1]] = entry_unit(entry[2])
    end
  end
  for _, id in ipairs(ids) do
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

-- ARGV (from `base`): `count` groups of stream, entry_id, delivery_count,
-- unit_id, tail: the client-built rest of the finalized event after its
-- header (',"outcome":...,"entry_id":"..."}'), none of it decided here.
-- The same result as `count` finalize calls in order, in one call.
-- Reply: one status per delivery ("OK", "STALE" or "CORRUPT").
local function finalize_batch(m, count, base)
  count = tonumber(count)
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
    local counts, units_of = fence_tables(stream, ids)
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

-- ARGV: stream, entry_id, delivery_count, unit_id, unit_type, duration_ms,
--       failure_summary_json, errors_json.
local function requeue(m, short, entry_id, delivery_count, unit_id, unit_type, duration_ms, summary_json, errors_json)
  local stream, state = fenced_state(short, entry_id, delivery_count, unit_id)
  if not stream then
    return state
  end
  local unit_json = jstr(unit_id)
  -- Subtracting an epsilon keeps ceil(100 * 0.7) at 70, not 71.
  local max_units = math.max(0, math.ceil(m.total_units * m.requeue_tolerance - 1e-9))
  local over_unit_cap = state.retry_index + 1 > m.max_requeues
  local over_tolerance = (not state.entered_retry) and m.requeued_units >= max_units

  if over_unit_cap or over_tolerance then
    finalize_entry(stream, entry_id, unit_json, state, "failed", duration_ms, '"retry_budget_exhausted"', errors_json,
      ',"failure_summary":' .. raw_or_null(summary_json))
    touch_worker("null", 1)
    renew_ttls(m.ttl_ms)
    return { "FINALIZED", state.retry_index }
  end

  if not state.entered_retry then
    state.entered_retry = true
    redis.call("HINCRBY", meta, "requeued_units_count", 1)
  end
  local previous_retry_index = state.retry_index
  state.retry_index = state.retry_index + 1
  write_state(unit_id, state)
  redis.call("XACK", stream, GROUP, entry_id)
  local new_entry_id = redis.call("XADD", priority, "*", "id", unit_id, "type", unit_type)
  append_json(event_head("requeued", unit_json, state) .. string.format(
    ',"previous_retry_index":%d,"duration_ms":%d,"failure_summary":%s,"errors":%s,"stream":"%s","entry_id":"%s","new_entry_id":"%s"}',
    previous_retry_index, tonumber(duration_ms) or 0, raw_or_null(summary_json), raw_or_null(errors_json), short,
    entry_id, new_entry_id))
  touch_worker("null", 1)
  renew_ttls(m.ttl_ms)
  return { "REQUEUED", state.retry_index }
end

-- ARGV: stream, entry_id, delivery_count, unit_id, elapsed_ms.
local function abandoned(m, short, entry_id, delivery_count, unit_id, elapsed_ms)
  local stream, state = fenced_state(short, entry_id, delivery_count, unit_id)
  if not stream then
    return state
  end
  append_json(event_head("abandoned", jstr(unit_id), state) .. string.format(
    ',"elapsed_ms":%d,"stream":"%s","entry_id":"%s"}', tonumber(elapsed_ms) or 0, short, entry_id))
  touch_worker(nil)
  renew_ttls(m.ttl_ms)
  return { "OK" }
end

-- ARGV (from `base`): `count` groups of stream, entry_id, delivery_count,
-- unit_id. Each fenced delivery goes back to the priority stream as a new
-- entry (its kind read from the old one), with no budget spent: the unit's
-- state is not written. The same result as `count` release calls in order.
-- Reply: one status per delivery ("OK", "STALE" or "CORRUPT").
local function release_batch(m, count, base)
  local reply = {}
  local released = 0
  for i = 1, tonumber(count) do
    local b = base + (i - 1) * 4
    local short, entry_id, unit_id = ARGV[b], ARGV[b + 1], ARGV[b + 3]
    local stream, state, row = fenced_state(short, entry_id, ARGV[b + 2], unit_id)
    if not stream then
      reply[i] = state[1]
    else
      redis.call("XACK", stream, GROUP, entry_id)
      local new_entry_id = redis.call("XADD", priority, "*", "id", unit_id, "type", row.kind)
      append_json(event_head("released", jstr(unit_id), state) .. string.format(
        ',"stream":"%s","entry_id":"%s","new_entry_id":"%s"}', short, entry_id, new_entry_id))
      released = released + 1
      reply[i] = "OK"
    end
  end
  if released > 0 then
    touch_worker("null", 0)
    renew_ttls(m.ttl_ms)
  end
  return reply
end

-- ARGV: current_unit (may be empty).
local function liveness(m, current_unit)
  if current_unit == nil or current_unit == "" then
    touch_worker("null")
  else
    touch_worker(jstr(current_unit))
  end
  renew_ttls(m.ttl_ms)
  return { "OK" }
end

-- ARGV: client-built event JSON without its closing brace (at_ms is stamped
-- here), the TTL for a log of a run that does not exist yet.
-- Not fenced, does not require meta.
local function append_prebuilt_event(body, orphan_ttl_ms)
  append_json(body .. ',"at_ms":' .. string.format("%d", now) .. "}")
  local ttl = tonumber(redis.call("HGET", meta, "ttl_ms")) or tonumber(orphan_ttl_ms)
  renew_ttls(ttl)
  return { "OK" }
end

-- ---------------------------------------------------------------------------
-- Dispatch
-- ---------------------------------------------------------------------------

local function dispatch()
  if mode == "worker_error" or mode == "stale_rejected" then
    return append_prebuilt_event(ARGV[3], ARGV[4])
  end

  local m = read_meta()
  if not m then
    return CORRUPT
  end

  if mode == "reserve" then
    return reserve(m, ARGV[3], ARGV[4], ARGV[5])
  elseif mode == "heartbeat" then
    return heartbeat(m, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  elseif mode == "finalize" then
    return { finalize_batch(m, 1, 3)[1] }
  elseif mode == "finalize_batch" then
    return finalize_batch(m, ARGV[3], 4)
  elseif mode == "requeue" then
    return requeue(m, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
  elseif mode == "abandoned" then
    return abandoned(m, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  elseif mode == "release_batch" then
    return release_batch(m, ARGV[3], 4)
  elseif mode == "liveness" then
    return liveness(m, ARGV[3])
  end
  return redis.error_reply("ERR unknown transition mode " .. tostring(mode))
end

local result = dispatch()
-- Every path that appends events renews the TTLs (and so flushes them);
-- this is a safety net.
flush_events()
return result
