-- transition.lua, part: the main queue as ranges of the unit list (format 5)
-- (The parts are joined in order in src/scripts.rs.)

-- The unit list is packed in `chunks`, CHUNK_UNITS units a field
-- (`unit\tkind\n` each; field c holds indexes c * CHUNK_UNITS onwards), and
-- every unit also has its main-stream entry "0-<index + 1>", which no worker
-- reads with `>`. A fresh delivery is a *range*: the units first..last cut
-- from meta's cursor by one reserve call, with one owner and one delivery
-- count, kept as one field of `ranges`:
--   ranges[first] = "<last>\t<delivery_count>\t<live>\t<done>\t<owner>"
-- where <done> holds a "0" (live) or "1" (finalized) per unit, `starts`
-- scores each first by itself (the range holding an index) and `clocks` by
-- its last delivery or beat (the reclaim clock). Only four things happen to
-- a range: it is cut, units of it are finalized, a beat naming all its live
-- units resets its clock, and it is deleted once none is live. Anything
-- else (a retry, a release, a beat naming only some, a reclaim) first
-- *explodes* it: its live units get pending rows of their own on the main
-- stream (XCLAIM ... FORCE, same owner, delivery count and idle time), and
-- the transition then runs on those rows as on any delivery. See
-- docs/queue-model.md for why each promise of the contract holds.

-- keys::CHUNK_UNITS
local CHUNK_UNITS = 128
-- The most units one range holds (its events go in one entry).
local RANGE_MAX = 4096
local LIVE, DONE = 48, 49 -- "0", "1"

-- A main-stream entry id's unit index, or nil for an id of another shape.
local function index_of(entry_id)
  local seq = string.match(entry_id, "^0%-(%d+)$")
  return seq and tonumber(seq) - 1
end

local function main_id(index)
  return string.format("0-%d", index + 1)
end

-- Chunks read by this call: c -> { text, offsets }; false when absent. The
-- field "o<c>" beside chunk c holds where each of its lines starts, and
-- where the last one ends, as 4-byte big-endian integers (written by the
-- initialisation), so no call scans a chunk for its newlines.
local chunk_cache
local function chunk(c)
  local cached = chunk_cache[c]
  if cached == nil then
    cached = false
    local got = redis.call("HMGET", chunks, c, "o" .. c)
    if got[1] and got[2] then
      cached = { got[1], got[2] }
    end
    chunk_cache[c] = cached
  end
  return cached
end

-- Where line k (from 1) of chunk `ch` starts; k one past its last line
-- gives the end of that line plus one. nil past that.
local function line_start(ch, k)
  if k < 1 or 4 * k > #ch[2] then
    return nil
  end
  return (struct.unpack(">I4", ch[2], 4 * k - 3))
end

-- The packed lines of units first..first+n-1, or nil when a chunk is lost.
local function packed_units(first, n)
  local parts, i, stop = {}, first, first + n - 1
  while i <= stop do
    local c = math.floor(i / CHUNK_UNITS)
    local ch = chunk(c)
    local base = c * CHUNK_UNITS
    local last = math.min(stop, base + CHUNK_UNITS - 1)
    local from, to = ch and line_start(ch, i - base + 1), ch and line_start(ch, last - base + 2)
    if not from or not to then
      return nil
    end
    parts[#parts + 1] = string.sub(ch[1], from, to - 1)
    i = last + 1
  end
  return table.concat(parts)
end

-- The chunk text holding the unit at `index`, and where its line starts;
-- nil when the chunk is lost.
local function line_of(index)
  local c = math.floor(index / CHUNK_UNITS)
  local ch = chunk(c)
  local at = ch and line_start(ch, index - c * CHUNK_UNITS + 1)
  if not at then
    return nil
  end
  return ch[1], at
end

-- The unit at `index`, or nil.
local function unit_at(index)
  local text, at = line_of(index)
  local tab = text and string.find(text, "\t", at, true)
  return tab and string.sub(text, at, tab - 1)
end

-- Whether the unit at `index` is `unit` (a handle naming another unit's
-- entry is not the caller's).
local function unit_at_is(index, unit)
  local text, at = line_of(index)
  return text ~= nil and string.byte(text, at + #unit) == 9 and string.find(text, unit, at, true) == at
end

-- Ranges read by this call (a list; a deleted or exploded one is `gone`).
local range_cache

local function parse_range(first, raw)
  local last, count, live, done, owner = string.match(raw, "^(%d+)\t(%d+)\t(%d+)\t([01]+)\t(.*)$")
  if not last then
    return nil
  end
  return { first = first, last = tonumber(last), count = tonumber(count), live = tonumber(live), done = done,
    owner = owner }
end

-- Set when `starts`, `ranges` or `clocks` was lost while the run's meta was
-- not (Redis loses or evicts whole keys): a unit of a lost range could be
-- neither finalized nor reclaimed, so the call answers CORRUPT. `starts`
-- and `clocks` hold a member "-1" from the initialisation on (scored -1 and
-- 0), so they are never empty while they exist.
local ranges_lost

-- The live range holding main index `i`, or nil (`ranges_lost` set when the
-- range keys are gone).
local function range_of(i)
  for _, r in ipairs(range_cache) do
    if r.first <= i and i <= r.last then
      if r.gone then
        return nil
      end
      return r
    end
  end
  local found = redis.call("ZREVRANGEBYSCORE", starts, i, "-inf", "LIMIT", 0, 1)[1]
  if not found then
    ranges_lost = true
    return nil
  end
  if found == "-1" then
    return nil
  end
  local first = tonumber(found)
  for _, r in ipairs(range_cache) do
    if r.first == first then
      return nil
    end
  end
  local raw = redis.call("HGET", ranges, found)
  local r = raw and parse_range(first, raw)
  if not r then
    ranges_lost = true
    return nil
  end
  range_cache[#range_cache + 1] = r
  if i > r.last then
    return nil
  end
  return r
end

-- The reply of a batch call when the range keys were lost: CORRUPT for each
-- of its `count` items, nothing written.
local function all_corrupt(count)
  local reply = {}
  for i = 1, count do
    reply[i] = "CORRUPT"
  end
  return reply
end

-- Whether the unit at index `i` of range `r` is live (not finalized).
local function live_in(r, i)
  return string.byte(r.done, i - r.first + 1) == LIVE
end

local function write_range(r)
  redis.call("HSET", ranges, r.first, string.format("%d\t%d\t%d\t%s\t%s", r.last, r.count, r.live, r.done, r.owner))
end

local function delete_range(r)
  redis.call("HDEL", ranges, r.first)
  redis.call("ZREM", starts, r.first)
  redis.call("ZREM", clocks, r.first)
  r.gone = true
end

-- Marks units of range `r` done (`offsets`: their indexes minus first, plus
-- one), and deletes the range once none is live.
local function finish_in_range(r, offsets)
  local bytes = { string.byte(r.done, 1, -1) }
  for _, k in ipairs(offsets) do
    bytes[k] = DONE
  end
  r.live = r.live - #offsets
  redis.call("HINCRBY", meta, "range_live", -#offsets)
  if r.live <= 0 then
    delete_range(r)
  else
    r.done = string.char(unpack(bytes))
    write_range(r)
  end
end

-- Gives each live unit of range `r` a pending row of its own on the main
-- stream, with the range's owner, delivery count and idle time, and deletes
-- the range.
local function explode(r)
  local clock = tonumber(redis.call("ZSCORE", clocks, r.first)) or now
  local idle = math.max(0, now - clock)
  local ids = {}
  for k = 1, #r.done do
    if string.byte(r.done, k) == LIVE then
      ids[#ids + 1] = main_id(r.first + k - 1)
    end
  end
  for first = 1, #ids, 512 do
    local args = { "XCLAIM", units, GROUP, r.owner, 0 }
    for k = first, math.min(first + 511, #ids) do
      args[#args + 1] = ids[k]
    end
    args[#args + 1], args[#args + 2], args[#args + 3], args[#args + 4] = "IDLE", idle, "RETRYCOUNT", r.count
    args[#args + 1], args[#args + 2] = "FORCE", "JUSTID"
    redis.call(unpack(args))
  end
  redis.call("HINCRBY", meta, "range_live", -r.live)
  delete_range(r)
end

-- Before a transition that a range cannot take (retry, release, abandon, a
-- partial beat): a main-stream delivery still in a range gets its own row.
-- false when the range keys were lost (the caller answers CORRUPT).
local function settle(stream, entry_id)
  if stream ~= units then
    return true
  end
  local i = index_of(entry_id)
  local r = i and range_of(i)
  if r then
    explode(r)
  end
  return not ranges_lost
end

-- Cuts a range of `n` units from the cursor for this worker: its packed
-- units, or nil when the unit list or the range keys are lost (a range
-- written into re-made keys would hide the loss).
local function cut_range(m, n)
  if not redis.call("ZSCORE", starts, -1) or not redis.call("ZSCORE", clocks, -1) then
    ranges_lost = true
    return nil
  end
  local first = m.cursor
  local packed = packed_units(first, n)
  if not packed then
    return nil
  end
  local r = { first = first, last = first + n - 1, count = 1, live = n, done = string.rep("0", n),
    owner = worker_id, cut = true }
  write_range(r)
  redis.call("ZADD", starts, first, first)
  redis.call("ZADD", clocks, now, first)
  redis.call("HINCRBY", meta, "range_live", n)
  m.cursor = r.last + 1
  redis.call("HSET", meta, "cursor", m.cursor)
  range_cache[#range_cache + 1] = r
  append_range(string.format("%d", first), packed, n)
  return packed
end

-- The ranges idle for at least `after_ms` (not cut by this call) are
-- exploded, so reclaim reads their units as pending rows, oldest first.
local function explode_idle(after_ms)
  local idle = redis.call("ZRANGEBYSCORE", clocks, "-inf", now - after_ms)
  if #idle == 0 then
    ranges_lost = true
  end
  for _, found in ipairs(idle) do
    if found ~= "-1" then
      local r = range_of(tonumber(found))
      if r and not r.cut then
        explode(r)
      end
    end
  end
end
