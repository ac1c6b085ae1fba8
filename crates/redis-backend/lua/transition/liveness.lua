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

-- mode leave: the worker makes no more transitions; it no longer counts as
-- live for retry placement until its next transition.
local function leave(m)
  touch_worker("null")
  local raw = redis.call("HGET", workers, worker_id)
  redis.call("HSET", workers, worker_id, string.sub(raw, 1, -2) .. ',"left":true}')
  renew_ttls(m.ttl_ms)
  return { "OK" }
end
