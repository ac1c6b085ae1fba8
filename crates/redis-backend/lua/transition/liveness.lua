-- transition.lua, part: mode liveness
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: current_unit (may be empty).
local function liveness(m, current_unit)
  if current_unit == nil or current_unit == "" then
    touch_worker("null")
  else
    touch_worker(jstr(current_unit))
  end
  renew_ttls(m.ttl_ms)
  return { "OK" }
end
