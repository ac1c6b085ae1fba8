-- transition.lua, part: mode heartbeat_batch
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV (from `base`): groups of stream, entry_id, delivery_count, unit_id,
-- `count` of them. The same result as `count` heartbeat calls in order, in
-- one call: each item is fenced on its own, the renewed entries are claimed
-- (idle time reset) with one XCLAIM per stream, the worker record and the
-- TTLs are written once. Reply: one status per delivery ("OK" or "STALE").
local function heartbeat_batch(m, count, base)
  count = tonumber(count)
  local reply = {}
  local claims = { [units] = {}, [priority] = {} }
  local current = nil
  for i = 1, count do
    local b = base + (i - 1) * 4
    local stream = stream_key(ARGV[b])
    local unit_id = ARGV[b + 3]
    if stream and fence(stream, ARGV[b + 1], ARGV[b + 2], unit_id) then
      local ids = claims[stream]
      ids[#ids + 1] = ARGV[b + 1]
      current = unit_id
      reply[i] = "OK"
    else
      reply[i] = "STALE"
    end
  end
  if not current then
    return reply
  end
  for stream, ids in pairs(claims) do
    for first = 1, #ids, 512 do
      local args = { "XCLAIM", stream, GROUP, worker_id, 0 }
      for k = first, math.min(first + 511, #ids) do
        args[#args + 1] = ids[k]
      end
      args[#args + 1] = "JUSTID"
      redis.call(unpack(args))
    end
  end
  touch_worker(jstr(current))
  renew_ttls(m.ttl_ms)
  return reply
end
