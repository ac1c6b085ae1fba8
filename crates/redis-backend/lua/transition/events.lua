-- transition.lua, part: the call's events, the worker record, the shared terminal finalize
-- (The parts are joined in order in src/scripts.rs.)

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
-- needs escaping). Unit ids hold no control characters (UnitId refuses
-- them), so only a quote or a backslash needs escaping; two plain finds cost
-- a tenth of one pattern find with a character class (about 3 µs per id in
-- Redis's Lua), the largest per-unit cost of a batch.
local function put_unit_json(n, unit)
  if string.find(unit, '"', 1, true) or string.find(unit, "\\", 1, true) then
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
