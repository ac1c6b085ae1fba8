-- Idempotent leader election for one run: the first caller writes the units,
-- the consumer groups and the frozen budgets; later callers are told the run
-- exists (and get its budgets) or, with another unit list, that it differs.
--
-- KEYS: units, units:priority, attempts, meta, unit_state, workers, parked,
--       chunks, special, ranges, starts, clocks
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
local chunks, special, ranges, starts, clocks = KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
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
redis.call("DEL", units, priority, unit_state, workers, parked, chunks, special, ranges, starts, clocks)
total = tonumber(total)

local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The main queue (format 5, transition/ranges.lua): the unit list packed in
-- `chunks`, CHUNK_UNITS units a field (`unit\tkind\n`; field "o<c>" holds
-- where each line of chunk c starts, as 4-byte integers), and each unit's
-- main-stream entry "0-<index + 1>": one field, the unit id valued its kind,
-- then "\1group" valued the group for a unit in one. No worker reads that
-- stream with `>` (the group starts at its end): it holds the pending rows
-- of units that left their range or were delivered alone. Those (units in a
-- group, and units whose kind holds a tab or a newline) are in `special`.
-- A unit's state is stored only once it differs from the fresh one (the
-- scripts read an absent state as fresh): here, only quarantined units'.
-- The field "\1sparse" tells a run of fresh units from a lost state hash
-- (Redis loses or evicts whole keys, never one field of a hash).
-- keys::CHUNK_UNITS
local CHUNK_UNITS = 128
local BATCH = 256
local states = { "\1sparse", "1" }
local has_groups, has_special = 0, 0
local lines, specials = {}, {}
for i = 1, total do
  local id, kind, group, quarantined = ARGV[5 + 4 * i], ARGV[6 + 4 * i], ARGV[7 + 4 * i], ARGV[8 + 4 * i]
  local index = i - 1
  local entry_id = string.format("0-%d", i)
  local odd_kind = string.find(kind, "[\t\n]") ~= nil
  if group == "" and quarantined ~= "1" then
    redis.call("XADD", units, entry_id, id, kind)
  else
    local args = { "XADD", units, entry_id, id, kind }
    if group ~= "" then
      args[#args + 1], args[#args + 2] = "\1group", group
    end
    if quarantined == "1" then
      -- Read back by `units` only (the scripts read it from the unit's state).
      args[#args + 1], args[#args + 2] = "\1quarantined", "1"
    end
    redis.call(unpack(args))
  end
  if group ~= "" then
    has_groups = 1
  end
  if group ~= "" or odd_kind then
    has_special = 1
    specials[#specials + 1], specials[#specials + 2] = index, index
    if #specials >= 2 * BATCH then
      redis.call("ZADD", special, unpack(specials))
      specials = {}
    end
    lines[#lines + 1] = id .. "\t\n"
  else
    lines[#lines + 1] = id .. "\t" .. kind .. "\n"
  end
  if #lines == CHUNK_UNITS or i == total then
    -- Where each line starts, and the last one ends (transition/ranges.lua).
    local offsets, at = {}, 1
    for k = 1, #lines do
      offsets[k] = struct.pack(">I4", at)
      at = at + #lines[k]
    end
    offsets[#lines + 1] = struct.pack(">I4", at)
    local c = math.floor(index / CHUNK_UNITS)
    redis.call("HSET", chunks, c, table.concat(lines), "o" .. c, table.concat(offsets))
    lines = {}
  end
  if quarantined == "1" then
    states[#states + 1] = id
    states[#states + 1] = '{"retry_index":0,"reclaim_count":0,"entered_retry":false,"quarantined":true}'
    if #states >= 2 * BATCH then
      redis.call("HSET", unit_state, unpack(states))
      states = {}
    end
  end
end
if #specials > 0 then
  redis.call("ZADD", special, unpack(specials))
end
if #states > 0 then
  redis.call("HSET", unit_state, unpack(states))
end
-- Never empty while they exist (transition/ranges.lua: `ranges_lost`).
redis.call("ZADD", starts, -1, -1)
redis.call("ZADD", clocks, 0, -1)
redis.call("XGROUP", "CREATE", units, "workers", "$", "MKSTREAM")
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
  "has_groups", has_groups,
  "has_special", has_special,
  "cursor", 0,
  "range_live", 0)

for _, key in ipairs({ units, priority, attempts, meta, unit_state, workers, parked, chunks, special, ranges, starts,
  clocks }) do
  redis.call("PEXPIRE", key, ttl_ms)
end
return { "INITIALIZED" }
