-- transition.lua, part: the header, the keys and arguments, the clock
-- (The parts are joined in order in src/scripts.rs.)

-- State transitions of one run of the fenced unit queue. One dispatcher, one
-- function per mode; modelled on rspec-hopper's transition.lua (the seed).
--
-- KEYS: units, units:priority, attempts, meta, unit_state, workers, parked,
--       chunks, special, ranges, starts, clocks
--       (all share the run's hash tag; parked is a sorted set of the
--       entries waiting for a place in their full group; the last five hold
--       the main queue's ranges, see ranges.lua)
-- ARGV: mode, worker_id, then mode-specific arguments (see dispatch).
--
-- Replies are arrays whose first element is a status string: "OK", "NONE",
-- "FINALIZED", "REQUEUED", "STOPPED" (reserve on a run at its failure limit),
-- "STALE" (fence failed) or "CORRUPT" (meta is missing, the unit's
-- unit_state entry is unreadable, or the state hash was lost: see
-- `absent_is_fresh`). STALE and CORRUPT are
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
-- * Fail fast is new: every failed finalization adds to meta's failed_count,
--   and `reserve` replies STOPPED once it reaches max_failures (absent: no
--   limit, as in runs stored before the field existed).
-- * `release_batch` is new: a worker hands deliveries back (shutting down,
--   prefetched units) without spending a retry or reclaim budget; the seed
--   could only abandon them to the reclaim timeout, which costs a reclaim.

-- The transitions are a Redis function library, loaded once (its body
-- runs at FUNCTION LOAD, not at each call): the call's keys, arguments and
-- clock below are set by `begin` (dispatch.lua) at the start of each call,
-- and every cache of one call is emptied there too.
local KEYS, ARGV
local units, priority, attempts, meta, unit_state, workers, parked
local chunks, special, ranges, starts, clocks
local mode, worker_id

local GROUP = "workers"
-- Whether the run has groups (meta's has_groups), set by the dispatch.
local has_groups
local STALE, CORRUPT = { "STALE" }, { "CORRUPT" }

-- The call's clock (ms), from Redis's TIME.
local now
