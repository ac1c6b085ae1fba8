-- Counts one run's outcomes into the units' pass streaks (the
-- TimingsStore contract's `record_outcomes`; leasehold_core::PassStreak::after
-- is the reference, this is the same rule in Lua).
--
-- A streak is one hash field per unit, valued "<passes> <before> <run>": the
-- run is last, so that any characters in it survive a split on the first
-- two spaces. Read, changed and written inside one script so that two
-- reports of different builds counting the same unit both count (a client's
-- read-modify-write would lose one).
--
-- KEYS: hopper:streaks (hash)
-- ARGV: run, ttl_secs, then (unit, "1" passed | "0" not) pairs

local run = ARGV[1]
-- One HMGET and one HSET per call, not a read and a write per unit.
local fields = {}
for i = 3, #ARGV, 2 do
  fields[#fields + 1] = ARGV[i]
end
if #fields == 0 then
  return #ARGV
end
local olds = redis.call("HMGET", KEYS[1], unpack(fields))
local writes = {}
for k, unit in ipairs(fields) do
  local passed = ARGV[2 + 2 * k] == "1"
  local passes, before, last = 0, 0, ""
  local old = olds[k]
  if old then
    local p, b, r = string.match(old, "^(%d+) (%d+) (.*)$")
    if p then
      passes, before, last = tonumber(p), tonumber(b), r
    end
  end
  -- The newest run recorded again: its outcome is replaced, not counted twice.
  if last ~= run or last == "" then
    before = passes
  end
  if passed then
    passes = before + 1
  else
    passes = 0
  end
  writes[#writes + 1] = unit
  writes[#writes + 1] = passes .. " " .. before .. " " .. run
end
redis.call("HSET", KEYS[1], unpack(writes))
redis.call("EXPIRE", KEYS[1], ARGV[2])
return #ARGV
