-- transition.lua, part: the call's events, the worker record, the shared terminal finalize
-- (The parts are joined in order in src/scripts.rs.)

-- Built by concatenating cached pieces: the per-type prefix and the
-- per-(retry_index, reclaim_count) suffix are made once per call.
local now_str
local head_prefix, head_suffix = {}, nil
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

-- Events of this call, appended to the attempts stream by flush_events.
-- One event of the JSON kind is a "json" entry (the event's JSON). Otherwise
-- the call's events go packed into one entry whose fields are a flat list
-- of tokens (Redis stores them as field/value pairs; a lone "" pads the last
-- pair): "packed", worker_id, "at_ms", at_ms, then per event
--
-- * "S", stream, "<retry_index>:<reclaim_count>", n, then n pairs of unit
--   and entry_id: n fresh `delivered` events (delivery count 1) by this
--   worker at at_ms (format 3 wrote "D", unit, stream, entry_id, state
--   for each);
-- * "R", first, packed: the fresh `delivered` events of one range (format
--   5, see append_range);
-- * "F", unit, "<retry_index>:<reclaim_count>", tail: a `finalized` event
--   whose fields after the header are the client-built JSON `tail`;
-- * "J", json: any event, whole.
--
-- The reader (`attempts_entry` in src/queue.rs) rebuilds the events as JSON:
-- the same events as before, for a fraction of the Redis CPU (no JSON is
-- built here for the two events every unit has, and no string is
-- concatenated: Redis copies each token once). Entries written before this
-- format hold "json" (one event) or "batch" (a JSON array). The reader
-- numbers the events of an entry <ms>-<seq> as EventId <ms>-<seq * 65536 + index>.
local EVENTS_PER_ENTRY = 65536
-- Tokens per entry at most: XADD's arguments are unpacked onto Lua's C stack.
local TOKENS_PER_ENTRY = 6000
local ev_args, ev_n, ev_count, ev_json_only

local ev_run_at
local function ev_reset()
  ev_args = { "XADD", attempts, "*", "packed", worker_id, "at_ms", now_str }
  ev_n, ev_count, ev_json_only = 7, 0, true
  ev_run_at = nil
end

-- Starts an event of `tokens` tokens.
local function event_begin(tokens)
  if ev_count >= EVENTS_PER_ENTRY or ev_n + tokens > TOKENS_PER_ENTRY then
    flush_events()
  end
  ev_count = ev_count + 1
  ev_run_at = nil
end

local function append_json(json)
  event_begin(2)
  ev_args[ev_n + 1] = "J"
  ev_args[ev_n + 2] = json
  ev_n = ev_n + 2
end

-- "<retry_index>:<reclaim_count>" of a state, made once per call.
local state_codes = {}
local function state_code(state)
  local k = state.retry_index * 65536 + state.reclaim_count
  local code = state_codes[k]
  if not code then
    code = string.format("%d:%d", state.retry_index, state.reclaim_count)
    state_codes[k] = code
  end
  return code
end

-- A fresh `delivered` event (delivery count 1). The fresh deliveries of one
-- reserve call share their stream and state, so they go as one run: "S",
-- stream, state code, n, then n pairs of unit and entry id (two tokens a
-- unit, not five). Any other event ends the run.
local ev_run_short, ev_run_code
local function append_delivered(unit, short, entry_id, state)
  local code = state_code(state)
  if ev_run_at and ev_run_short == short and ev_run_code == code
      and ev_count < EVENTS_PER_ENTRY and ev_n + 2 <= TOKENS_PER_ENTRY then
    ev_count = ev_count + 1
    ev_args[ev_n + 1] = unit
    ev_args[ev_n + 2] = entry_id
    ev_n = ev_n + 2
    ev_args[ev_run_at] = ev_args[ev_run_at] + 1
    return
  end
  event_begin(6)
  ev_args[ev_n + 1] = "S"
  ev_args[ev_n + 2] = short
  ev_args[ev_n + 3] = code
  ev_args[ev_n + 4] = 1
  ev_args[ev_n + 5] = unit
  ev_args[ev_n + 6] = entry_id
  ev_run_at, ev_run_short, ev_run_code = ev_n + 4, short, code
  ev_n = ev_n + 6
  ev_json_only = false
end

-- The fresh `delivered` events of one range (format 5): "R", the index of
-- its first unit, then its `n` units packed as the chunks hold them
-- (`unit\tkind\n` each), in three tokens however many units it holds. The
-- reader names their entries "0-<index + 1>" on the main stream, with the
-- fresh state 0:0 (a unit in a range has never been delivered).
local function append_range(first, packed, n)
  if ev_count + n > EVENTS_PER_ENTRY then
    flush_events()
  end
  event_begin(3)
  ev_count = ev_count + n - 1
  ev_args[ev_n + 1] = "R"
  ev_args[ev_n + 2] = first
  ev_args[ev_n + 3] = packed
  ev_n = ev_n + 3
  ev_json_only = false
end

-- A `finalized` event whose fields after the header are `tail` (JSON, from
-- the client: ',"outcome":...}').
local function append_finalized(unit, state, tail)
  event_begin(4)
  ev_args[ev_n + 1] = "F"
  ev_args[ev_n + 2] = unit
  ev_args[ev_n + 3] = state_code(state)
  ev_args[ev_n + 4] = tail
  ev_n = ev_n + 4
  ev_json_only = false
end

flush_events = function()
  if ev_count == 1 and ev_json_only then
    redis.call("XADD", attempts, "*", "json", ev_args[9])
  elseif ev_count > 0 then
    -- XADD's fields come in pairs.
    if (ev_n - 3) % 2 == 1 then
      ev_n = ev_n + 1
      ev_args[ev_n] = ""
    end
    redis.call(unpack(ev_args, 1, ev_n))
  end
  ev_reset()
end

-- Merges into workers[worker_id]: last_seen = now; current_unit = `current`
-- (raw JSON: a string literal or null) unless nil; processed += delta.
local function touch_worker(current, delta)
  local raw = redis.call("HGET", workers, worker_id)
  local cur, processed = "null", 0
  if raw then
    local c, p = string.match(raw, '^{"last_seen":%d+,"current_unit":(.*),"processed":(%d+)}$')
    if not c then
      c, p = string.match(raw, '^{"last_seen":%d+,"current_unit":(.*),"processed":(%d+),"left":true}$')
    end
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
-- reclaim (budget exhausted): XACK, finalized event, finalized_count += 1,
-- and failed_count += 1 for a failure (the fail-fast count).
-- `extra` is raw JSON fields to append (",\"k\":v..."), or "".
local function finalize_entry(stream, entry_id, unit_json, state, outcome, duration_ms, reason_json, errors_json, extra)
  local group = nil
  if has_groups then
    local range = redis.call("XRANGE", stream, entry_id, entry_id)
    if type(range[1]) == "table" then
      local _
      _, _, _, _, group = entry_unit(range[1][2])
    end
  end
  redis.call("XACK", stream, GROUP, entry_id)
  group_freed(group)
  append_json(event_head("finalized", unit_json, state) .. string.format(
    ',"outcome":"%s","duration_ms":%d,"reason":%s,"errors":%s,"stream":"%s","entry_id":"%s"%s}',
    outcome, tonumber(duration_ms) or 0, raw_or_null(reason_json), raw_or_null(errors_json),
    stream_short(stream), entry_id, extra))
  redis.call("HINCRBY", meta, "finalized_count", 1)
  if outcome == "failed" and not state.quarantined then
    redis.call("HINCRBY", meta, "failed_count", 1)
  end
end
