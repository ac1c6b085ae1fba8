-- A measuring prototype of the range model (docs/queue-model.md, "The range
-- model"): the steady-state path only, to learn what it costs Redis per
-- unit before it is built. It is not a queue: no reclaim, no retries, no
-- groups, no priority stream reads. What it does, it does as the built
-- model would, with the same per-call work as the real transition script
-- (the clock, the meta read, the worker record, the TTLs, one event entry).
--
-- KEYS: meta, chunks, ranges, starts, clocks, attempts, workers, unit_state
--   chunks  hash: chunk number -> its units packed "unit\tkind\n..." (K each)
--   ranges  hash: range id -> "owner|delivery_count|first|last|done" where
--           done holds one byte per unit of the range ("0", or "1" once
--           finalized)
--   starts  sorted set: range id scored by its first unit's index (finding
--           the range that holds a unit)
--   clocks  sorted set: range id scored by its last delivery or beat (ms)
-- ARGV: mode, worker_id, then per mode:
--   init:     K, then the unit ids (kind "test")
--   reserve:  max -> { range_id, first, packed units of the range }, or {}
--   finalize: n_ranges, then per range: range_id, delivery_count, n, then n
--             groups of index, unit, tail -> one "OK"/"STALE" per unit

local meta, chunks, ranges, starts, clocks, attempts, workers, unit_state =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local mode, worker_id = ARGV[1], ARGV[2]
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_str = string.format("%d", now)

local events = { "XADD", attempts, "*", "packed", worker_id, "at_ms", now_str }
local function flush_events()
  if #events > 7 then
    if (#events - 3) % 2 == 1 then
      events[#events + 1] = ""
    end
    redis.call(unpack(events))
  end
end

local function touch_worker(delta)
  local raw = redis.call("HGET", workers, worker_id)
  local processed = 0
  if raw then
    processed = tonumber(string.match(raw, ',"processed":(%d+)}$')) or 0
  end
  redis.call("HSET", workers, worker_id,
    string.format('{"last_seen":%d,"current_unit":null,"processed":%d}', now, processed + delta))
end

local function renew_ttls(ttl)
  flush_events()
  for _, key in ipairs({ meta, chunks, ranges, starts, clocks, attempts, workers, unit_state }) do
    redis.call("PEXPIRE", key, ttl)
  end
end

-- Start offsets of every unit line of a chunk (integers: no string is made).
local function line_starts(packed)
  local out, at = {}, 1
  while at <= #packed do
    out[#out + 1] = at
    at = string.find(packed, "\n", at, true) + 1
  end
  out[#out + 1] = at
  return out
end

if mode == "init" then
  local k = tonumber(ARGV[3])
  local total = #ARGV - 3
  local parts, args = {}, { "HSET", chunks }
  for i = 1, total do
    parts[#parts + 1] = ARGV[3 + i]
    parts[#parts + 1] = "\ttest\n"
    if i % k == 0 or i == total then
      args[#args + 1] = math.floor((i - 1) / k)
      args[#args + 1] = table.concat(parts)
      parts = {}
      if #args >= 2 + 2 * 64 then
        redis.call(unpack(args))
        args = { "HSET", chunks }
      end
    end
  end
  if #args > 2 then
    redis.call(unpack(args))
  end
  -- Unit states are kept only for units whose state changed; this field
  -- tells a lost hash from a run of fresh units.
  redis.call("HSET", unit_state, "\1present", "1")
  redis.call("HSET", meta, "ttl_ms", 3600000, "total_units", total, "chunk_units", k, "cursor", 0,
    "range_seq", 0, "finalized_count", 0, "failed_count", 0)
  redis.call("PEXPIRE", meta, 3600000)
  return "OK"
end

local m = redis.call("HMGET", meta, "ttl_ms", "total_units", "chunk_units", "cursor", "range_seq",
  "max_requeues", "requeue_tolerance", "max_reclaims", "max_failures", "failed_count")
local ttl, total, k, cursor = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), tonumber(m[4])

if mode == "reserve" then
  local first = cursor
  local last = math.min(total, first + tonumber(ARGV[3])) - 1
  if last < first then
    return {}
  end
  local id = tonumber(m[5]) + 1
  -- The units of [first, last], cut from their chunks: one string a chunk.
  local slices = {}
  for c = math.floor(first / k), math.floor(last / k) do
    local packed = redis.call("HGET", chunks, c)
    local at = line_starts(packed)
    local lo, hi = math.max(first - c * k, 0) + 1, math.min(last - c * k, k - 1) + 1
    slices[#slices + 1] = string.sub(packed, at[lo], at[hi + 1] - 1)
  end
  redis.call("HSET", meta, "cursor", last + 1, "range_seq", id)
  redis.call("HSET", ranges, id, table.concat({ worker_id, "1", first, last, string.rep("0", last - first + 1) }, "|"))
  redis.call("ZADD", starts, first, id)
  redis.call("ZADD", clocks, now, id)
  events[#events + 1] = "DR"
  events[#events + 1] = id
  touch_worker(0)
  renew_ttls(ttl)
  return { id, first, table.concat(slices) }
end

if mode == "finalize" then
  local n_ranges = tonumber(ARGV[3])
  local b = 4
  local reply = {}
  local finalized = 0
  for _ = 1, n_ranges do
    local id, dc, n = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2])
    b = b + 3
    local raw = redis.call("HGET", ranges, id)
    local owner, rdc, first, last, done
    if raw then
      owner, rdc, first, last, done = string.match(raw, "^(.-)|(%d+)|(%d+)|(%d+)|(.*)$")
      first, last = tonumber(first), tonumber(last)
    end
    local live = raw and owner == worker_id and rdc == dc
    local marks, packed_of, starts_of = {}, {}, {}
    if live then
      for i = 1, #done do
        marks[i] = string.byte(done, i) == 49
      end
    end
    events[#events + 1] = "FR"
    events[#events + 1] = id
    local newly = 0
    for _ = 1, n do
      local index, unit, tail = tonumber(ARGV[b]), ARGV[b + 1], ARGV[b + 2]
      b = b + 3
      local ok = false
      if live and index and index >= first and index <= last and not marks[index - first + 1] then
        local c = math.floor(index / k)
        local packed = packed_of[c]
        if not packed then
          packed = redis.call("HGET", chunks, c)
          packed_of[c], starts_of[c] = packed, line_starts(packed)
        end
        local at = starts_of[c][index - c * k + 1]
        -- The fence's unit check: the handle's unit is the one at that index.
        ok = string.sub(packed, at, at + #unit) == unit .. "\t"
      end
      if ok then
        marks[index - first + 1] = true
        newly = newly + 1
        events[#events + 1] = index
        events[#events + 1] = tail
        reply[#reply + 1] = "OK"
      else
        reply[#reply + 1] = "STALE"
      end
    end
    if newly > 0 then
      finalized = finalized + newly
      local all = true
      local bytes = {}
      for i = 1, last - first + 1 do
        if marks[i] then
          bytes[i] = "1"
        else
          bytes[i] = "0"
          all = false
        end
      end
      if all then
        redis.call("HDEL", ranges, id)
        redis.call("ZREM", starts, id)
        redis.call("ZREM", clocks, id)
      else
        redis.call("HSET", ranges, id, table.concat({ owner, rdc, first, last, table.concat(bytes) }, "|"))
      end
    end
  end
  if finalized > 0 then
    redis.call("HINCRBY", meta, "finalized_count", finalized)
    touch_worker(finalized)
    renew_ttls(ttl)
  end
  return reply
end
return redis.error_reply("ERR unknown mode " .. tostring(mode))
