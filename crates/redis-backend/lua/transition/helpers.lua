-- transition.lua, part: small helpers: JSON, meta, TTLs, the fence, unit state
-- (The parts are joined in order in src/scripts.rs.)

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

-- The caller as a JSON string literal.
local worker_json

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
    "total_units", "requeued_units_count", "max_failures", "failed_count", "has_groups", "cursor", "has_special")
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
    -- nil: no limit (also a run stored before the budget existed).
    max_failures = tonumber(m[7]),
    failed = tonumber(m[8]) or 0,
    has_groups = m[9] == "1",
    -- The index of the first unit of the list not yet handed out (format 5).
    cursor = tonumber(m[10]) or 0,
    -- Whether some units are delivered one at a time (`special`).
    has_special = m[11] == "1",
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
  redis.call("PEXPIRE", parked, ttl_ms)
  redis.call("PEXPIRE", chunks, ttl_ms)
  redis.call("PEXPIRE", special, ttl_ms)
  redis.call("PEXPIRE", ranges, ttl_ms)
  redis.call("PEXPIRE", starts, ttl_ms)
  redis.call("PEXPIRE", clocks, ttl_ms)
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

-- Stream entry fields as unit, kind, then (when set) the worker a retry
-- should avoid, since when, and the unit's group: an entry is one field, the
-- unit id valued its kind ({unit, kind}), then optional fields whose names
-- start with byte 1 (a unit id holds no control character, so they cannot
-- clash): "\1avoid" worker, "\1since" ms, "\1group" "<limit>:<name>".
-- Entries written before that format hold {"id", unit, "type", kind}.
local AVOID, SINCE, GROUP_FIELD = "\1avoid", "\1since", "\1group"
local function entry_unit(fields)
  if fields[3] == nil then
    return fields[1], fields[2] or ""
  end
  if string.byte(fields[3], 1) == 1 then
    local avoid, since, group
    for i = 3, #fields, 2 do
      local name = fields[i]
      if name == AVOID then
        avoid = fields[i + 1]
      elseif name == SINCE then
        since = tonumber(fields[i + 1]) or 0
      elseif name == GROUP_FIELD then
        group = fields[i + 1]
      end
    end
    return fields[1], fields[2] or "", avoid, since, group
  end
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
  local unit, kind, _, _, group = entry_unit(range[1][2])
  if unit ~= unit_id then
    return nil
  end
  row.kind = kind
  row.group = group
  return row
end

-- XADD of a unit to the priority stream, with its optional fields.
local function add_priority(unit, kind, avoid, since, group)
  local args = { "XADD", priority, "*", unit, kind }
  if avoid then
    args[#args + 1], args[#args + 2], args[#args + 3], args[#args + 4] = AVOID, avoid, SINCE, since
  end
  if group then
    args[#args + 1], args[#args + 2] = GROUP_FIELD, group
  end
  return redis.call(unpack(args))
end

-- Groups: an entry met while its group is full waits in `parked` (it is
-- acknowledged on its stream), and each place its group frees (a unit of
-- the group finalized, requeued or released) puts the group's oldest parked
-- entry back on the priority stream. A member is the group, a sequence
-- number, the unit, the worker a retry avoids (or ""), since when, and the
-- kind, joined by byte 0 (no field but the kind, last, holds one), so a
-- lexicographic range of one group gives its entries oldest first.
local function park(stream, entry_id, unit, kind, avoid, since, group)
  redis.call("XACK", stream, GROUP, entry_id)
  local seq = redis.call("HINCRBY", meta, "park_seq", 1)
  redis.call("ZADD", parked, 0, table.concat(
    { group, string.format("%020d", seq), unit, avoid or "", tostring(since or ""), kind }, "\0"))
end

-- A group's units pending on workers, kept in meta as "\1running<group>"
-- (no fixed field starts with byte 1): raised as reserve hands a unit out,
-- lowered by `group_freed` where its pending entry ends, so reserve never
-- reads the pending lists to count them.
local RUNNING = "\1running"
local function group_running(group)
  return tonumber(redis.call("HGET", meta, RUNNING .. group)) or 0
end

local function group_started(group)
  if group then
    redis.call("HINCRBY", meta, RUNNING .. group, 1)
  end
end

local function unpark(group)
  local oldest = redis.call("ZRANGEBYLEX", parked, "[" .. group .. "\0", "(" .. group .. "\1", "LIMIT", 0, 1)[1]
  if not oldest then
    return
  end
  redis.call("ZREM", parked, oldest)
  local fields, at = {}, 1
  for _ = 1, 5 do
    local zero = string.find(oldest, "\0", at, true)
    fields[#fields + 1] = string.sub(oldest, at, zero - 1)
    at = zero + 1
  end
  local avoid, since = fields[4], tonumber(fields[5])
  if avoid == "" then
    avoid = nil
  end
  add_priority(fields[3], string.sub(oldest, at), avoid, since, group)
end

-- A group unit's pending entry ended (finalized, requeued, released): its
-- place goes to the group's oldest parked entry.
local function group_freed(group)
  if not group then
    return
  end
  redis.call("HINCRBY", meta, RUNNING .. group, -1)
  unpark(group)
end

-- A unit state as stored: the seed's JSON, and `,"quarantined":true` last
-- for a quarantined unit (its failures do not count toward the failure
-- limit). nil when unreadable.
local QUARANTINED = ',"quarantined":true'
local function parse_state(raw)
  local r, c, e, rest = string.match(raw, '^{"retry_index":(%d+),"reclaim_count":(%d+),"entered_retry":(%a+)(.-)}$')
  if not r or (e ~= "true" and e ~= "false") or (rest ~= "" and rest ~= QUARANTINED) then
    return nil
  end
  return { retry_index = tonumber(r), reclaim_count = tonumber(c), entered_retry = (e == "true"),
    quarantined = rest ~= "" }
end

local function fresh_state()
  return { retry_index = 0, reclaim_count = 0, entered_retry = false }
end
-- Shared, read-only: batch paths never change a state.
local FRESH_STATE = fresh_state()

-- An absent state is the fresh one while the state hash holds its "\1sparse"
-- field (written at initialisation: only changed states are stored); without
-- it the hash was lost, and the state with it. Read at most once a call.
local sparse
local function absent_is_fresh()
  if sparse == nil then
    sparse = redis.call("HEXISTS", unit_state, "\1sparse") == 1
  end
  return sparse
end

-- The unit's state (a table of its own, the caller may change it), or nil
-- when it is lost or unreadable (CORRUPT).
local function read_state(unit_id)
  local raw = redis.call("HGET", unit_state, unit_id)
  if not raw then
    if absent_is_fresh() then
      return fresh_state()
    end
    return nil
  end
  return parse_state(raw)
end

-- States of many units in one call: a list parallel to `unit_ids` (false
-- where lost or unreadable). Fresh states are the one FRESH_STATE.
local function read_states(unit_ids)
  local out = {}
  local CHUNK = 512
  for first = 1, #unit_ids, CHUNK do
    local last = math.min(first + CHUNK - 1, #unit_ids)
    local raws = redis.call("HMGET", unit_state, unpack(unit_ids, first, last))
    for i = 1, #raws do
      local raw = raws[i]
      local state = false
      if raw then
        state = parse_state(raw) or false
      elseif absent_is_fresh() then
        state = FRESH_STATE
      end
      out[first + i - 1] = state
    end
  end
  return out
end

local function write_state(unit_id, state)
  local quarantined = ""
  if state.quarantined then
    quarantined = QUARANTINED
  end
  redis.call("HSET", unit_state, unit_id, string.format(
    '{"retry_index":%d,"reclaim_count":%d,"entered_retry":%s%s}',
    state.retry_index, state.reclaim_count, tostring(state.entered_retry == true), quarantined))
end

-- The opening of a unit event (no closing brace): type and header fields.

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
