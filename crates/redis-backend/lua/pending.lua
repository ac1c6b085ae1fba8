-- Deliveries pending on workers, priority stream first, in entry order.
--
-- KEYS: units, units:priority, chunks, ranges, clocks
-- Reply: a flat list of { stream, entry_id, unit_id, worker, idle_ms, delivery_count }.
-- The main stream's rows and the live units of its ranges (format 5, see
-- transition/ranges.lua) come merged in index order.

local units, priority, chunks, ranges, clocks = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- keys::CHUNK_UNITS
local CHUNK_UNITS = 128
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- The unit of a stream entry's fields: one field, the unit valued its kind
-- (then fields named from byte 1); or (older entries) "id", unit, "type", kind.
local function entry_unit(fields)
  local extended = fields[3] ~= nil and string.byte(fields[3], 1) == 1
  if fields[3] == nil or extended then
    return fields[1] or false
  end
  for i = 1, #fields, 2 do
    if fields[i] == "id" then
      return fields[i + 1]
    end
  end
  return false
end

local function rows_of(stream, short)
  local out = {}
  if redis.call("EXISTS", stream) == 1 then
    for _, row in ipairs(redis.call("XPENDING", stream, "workers", "-", "+", 1000000)) do
      local unit = false
      local range = redis.call("XRANGE", stream, row[1], row[1])
      if type(range[1]) == "table" then
        unit = entry_unit(range[1][2])
      end
      out[#out + 1] = { short, row[1], unit, row[2], row[3], row[4] }
    end
  end
  return out
end

-- The live units of the ranges, as rows.
local function range_rows()
  local out = {}
  local all = redis.call("HGETALL", ranges)
  local lines = {}
  local function unit_at(index)
    local c = math.floor(index / CHUNK_UNITS)
    if lines[c] == nil then
      local list = {}
      for line in string.gmatch(redis.call("HGET", chunks, c) or "", "([^\n]*)\n") do
        list[#list + 1] = string.match(line, "^([^\t]*)")
      end
      lines[c] = list
    end
    return lines[c][index - c * CHUNK_UNITS + 1] or false
  end
  for k = 1, #all, 2 do
    local first = tonumber(all[k])
    local _, count, _, done, owner = string.match(all[k + 1], "^(%d+)\t(%d+)\t(%d+)\t([01]+)\t(.*)$")
    if first and done then
      local clock = tonumber(redis.call("ZSCORE", clocks, all[k])) or now
      for j = 1, #done do
        if string.byte(done, j) == 48 then
          local index = first + j - 1
          out[#out + 1] = { "units", string.format("0-%d", index + 1), unit_at(index), owner,
            math.max(0, now - clock), tonumber(count) }
        end
      end
    end
  end
  return out
end

local reply = rows_of(priority, "units:priority")
local main = rows_of(units, "units")
for _, row in ipairs(range_rows()) do
  main[#main + 1] = row
end
local function index(row)
  return tonumber(string.match(row[2], "^0%-(%d+)$")) or 0
end
table.sort(main, function(a, b)
  return index(a) < index(b)
end)
for _, row in ipairs(main) do
  reply[#reply + 1] = row
end
return reply
