-- transition.lua, part: mode heartbeat
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: stream, entry_id, delivery_count, unit_id.
local function heartbeat(m, short, entry_id, delivery_count, unit_id)
  local stream = stream_key(short)
  if not stream or not fence(stream, entry_id, delivery_count, unit_id) then
    return STALE
  end
  redis.call("XCLAIM", stream, GROUP, worker_id, 0, entry_id, "JUSTID")
  touch_worker(jstr(unit_id))
  renew_ttls(m.ttl_ms)
  return { "OK" }
end
