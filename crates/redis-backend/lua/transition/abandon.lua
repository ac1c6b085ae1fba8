-- transition.lua, part: mode abandoned
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: stream, entry_id, delivery_count, unit_id, elapsed_ms.
local function abandoned(m, short, entry_id, delivery_count, unit_id, elapsed_ms)
  if not settle(stream_key(short), entry_id) then
    return CORRUPT
  end
  local stream, state = fenced_state(short, entry_id, delivery_count, unit_id)
  if not stream then
    return state
  end
  append_json(event_head("abandoned", jstr(unit_id), state) .. string.format(
    ',"elapsed_ms":%d,"stream":"%s","entry_id":"%s"}', tonumber(elapsed_ms) or 0, short, entry_id))
  touch_worker(nil)
  renew_ttls(m.ttl_ms)
  return { "OK" }
end
