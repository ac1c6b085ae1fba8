-- Deliveries pending on workers, priority stream first, in entry order.
--
-- KEYS: units, units:priority
-- Reply: a flat list of { stream, entry_id, unit_id, worker, idle_ms, delivery_count }.

local units, priority = KEYS[1], KEYS[2]
local reply = {}
for _, pair in ipairs({ { priority, "units:priority" }, { units, "units" } }) do
  local stream, short = pair[1], pair[2]
  if redis.call("EXISTS", stream) == 1 then
    for _, row in ipairs(redis.call("XPENDING", stream, "workers", "-", "+", 1000000)) do
      local unit = false
      local range = redis.call("XRANGE", stream, row[1], row[1])
      if type(range[1]) == "table" then
        -- One field, the unit valued its kind; or (older entries) "id", unit, "type", kind.
        local fields = range[1][2]
        local extended = fields[3] ~= nil and string.byte(fields[3], 1) == 1
        if fields[3] == nil or extended then
          unit = fields[1] or false
        end
        for i = 1, #fields, 2 do
          if fields[3] ~= nil and not extended and fields[i] == "id" then
            unit = fields[i + 1]
          end
        end
      end
      reply[#reply + 1] = { short, row[1], unit, row[2], row[3], row[4] }
    end
  end
end
return reply
