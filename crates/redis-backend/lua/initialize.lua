-- Idempotent leader election for one run: the first caller writes the units,
-- the consumer groups and the frozen budgets; later callers are told the run
-- exists (and get its budgets) or, with another unit list, that it differs.
--
-- KEYS: units, units:priority, attempts, meta, unit_state, workers, parked
-- ARGV: "<format>:<fingerprint>" (the queue format of the caller's keys and
--       entries, then the unit list's hash), nonce, ttl_ms, max_requeues, requeue_tolerance,
--       max_reclaims, max_failures ("" for no limit), total, then `total`
--       quadruples of unit id, kind, group ("<limit>:<name>", or "" for
--       none), quarantined ("1", or "").
-- A probe passes "probe" for total and no units: the same replies when the
-- run exists, else { "ABSENT" } and nothing changes.
-- Reply: { "INITIALIZED" }
--      | { "ALREADY", max_requeues, requeue_tolerance, max_reclaims, max_failures }
--        (max_failures "" when the run has no limit, or predates it)
--      | { "MISMATCH", existing_total }
--      | { "FORMAT", existing_format } (the run was started by a worker that
--        writes another queue format; "1" for one from before the tag)
-- A retry of the same call (same nonce) after a lost reply answers
-- INITIALIZED again, so a re-sent initialize cannot demote the leader.

local units, priority, attempts, meta, unit_state, workers, parked =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local fingerprint, nonce, ttl_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local total = ARGV[8]

local existing = redis.call("HMGET", meta, "fingerprint", "init_nonce", "max_requeues", "requeue_tolerance",
  "max_reclaims", "total_units", "max_failures")
if existing[1] then
  -- The format comes first, so an older worker (whose fingerprint has no tag)
  -- meets MISMATCH here, and this one meets FORMAT there, never CORRUPT.
  local stored_format = string.match(existing[1], "^(%d+):") or "1"
  local our_format = string.match(fingerprint, "^(%d+):") or "1"
  if stored_format ~= our_format then
    return { "FORMAT", stored_format }
  end
  if existing[1] ~= fingerprint then
    return { "MISMATCH", tonumber(existing[6]) or 0 }
  end
  if existing[2] == nonce then
    return { "INITIALIZED" }
  end
  return { "ALREADY", existing[3], existing[4], existing[5], existing[7] or "" }
end
-- A probe (total "probe", no units) only asks whether the run exists.
if ARGV[8] == "probe" then
  return { "ABSENT" }
end

-- No meta: the run does not exist. Drop leftovers of an earlier run of the same
-- id (state whose meta was lost) so the groups and units start clean; the
-- event log is kept (worker errors may be recorded before initialisation).
redis.call("DEL", units, priority, unit_state, workers, parked)
total = tonumber(total)

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Main-stream entries share one millisecond (`<ms>-*`, Redis 7), so their
-- sequence numbers are consecutive: the entries a reserve call delivers are
-- runs of adjacent ids, and finalize_batch reads nearby ones with one range
-- read per span. Older servers (no `<ms>-*`) take "*".
local id_form = string.format("%d-*", now)
-- An entry is one field: the unit id, valued its kind (the fewest values
-- for the scripts to read back, twice per unit), then "\1group" valued the
-- group for a unit in one.
local function add_unit(form, i)
  local id, kind, group, quarantined = ARGV[5 + 4 * i], ARGV[6 + 4 * i], ARGV[7 + 4 * i], ARGV[8 + 4 * i]
  if group == "" and quarantined ~= "1" then
    return redis.pcall("XADD", units, form, id, kind)
  end
  local args = { "XADD", units, form, id, kind }
  if group ~= "" then
    args[#args + 1], args[#args + 2] = "\1group", group
  end
  if quarantined == "1" then
    -- Read back by `units` only (the scripts read it from the unit's state).
    args[#args + 1], args[#args + 2] = "\1quarantined", "1"
  end
  return redis.pcall(unpack(args))
end
local first = total > 0 and add_unit(id_form, 1)
if type(first) == "table" and first.err then
  id_form = "*"
  first = add_unit(id_form, 1)
  if type(first) == "table" and first.err then
    return redis.error_reply(first.err)
  end
end
-- A unit's state is stored only once it differs from the fresh one (the
-- scripts read an absent state as fresh): here, only quarantined units'.
-- The field "\1sparse" tells a run of fresh units from a lost state hash
-- (Redis loses or evicts whole keys, never one field of a hash).
local CHUNK = 256
local states = { "\1sparse", "1" }
local has_groups = 0
for i = 1, total do
  if ARGV[7 + 4 * i] ~= "" then
    has_groups = 1
  end
  if i > 1 then
    local added = add_unit(id_form, i)
    if type(added) == "table" and added.err then
      return redis.error_reply(added.err)
    end
  end
  if ARGV[8 + 4 * i] == "1" then
    states[#states + 1] = ARGV[5 + 4 * i]
    states[#states + 1] = '{"retry_index":0,"reclaim_count":0,"entered_retry":false,"quarantined":true}'
    if #states >= 2 * CHUNK then
      redis.call("HSET", unit_state, unpack(states))
      states = {}
    end
  end
end
if #states > 0 then
  redis.call("HSET", unit_state, unpack(states))
end
redis.call("XGROUP", "CREATE", units, "workers", "0", "MKSTREAM")
redis.call("XGROUP", "CREATE", priority, "workers", "0", "MKSTREAM")

redis.call("HSET", meta,
  "total_units", total,
  "finalized_count", 0,
  "requeued_units_count", 0,
  "failed_count", 0,
  "max_requeues", ARGV[4],
  "requeue_tolerance", ARGV[5],
  "max_reclaims", ARGV[6],
  "max_failures", ARGV[7],
  "fingerprint", fingerprint,
  "init_nonce", nonce,
  "ttl_ms", ttl_ms,
  "created_at_ms", now,
  "has_groups", has_groups)

for _, key in ipairs({ units, priority, attempts, meta, unit_state, workers, parked }) do
  redis.call("PEXPIRE", key, ttl_ms)
end
return { "INITIALIZED" }
