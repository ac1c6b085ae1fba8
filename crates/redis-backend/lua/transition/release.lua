-- transition.lua, part: mode release_batch
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV (from `base`): `count` groups of stream, entry_id, delivery_count,
-- unit_id. Each fenced delivery goes back to the priority stream as a new
-- entry (its kind read from the old one), with no budget spent: the unit's
-- state is not written. The same result as `count` release calls in order.
-- Reply: one status per delivery ("OK", "STALE" or "CORRUPT").
local function release_batch(m, count, base)
  local reply = {}
  local released = 0
  for i = 1, tonumber(count) do
    local b = base + (i - 1) * 4
    local short, entry_id, unit_id = ARGV[b], ARGV[b + 1], ARGV[b + 3]
    local stream, state, row
    if settle(stream_key(short), entry_id) then
      stream, state, row = fenced_state(short, entry_id, ARGV[b + 2], unit_id)
    else
      state = CORRUPT
    end
    if not stream then
      reply[i] = state[1]
    else
      redis.call("XACK", stream, GROUP, entry_id)
      local new_entry_id = add_priority(unit_id, row.kind, nil, nil, row.group)
      group_freed(row.group)
      append_json(event_head("released", jstr(unit_id), state) .. string.format(
        ',"stream":"%s","entry_id":"%s","new_entry_id":"%s"}', short, entry_id, new_entry_id))
      released = released + 1
      reply[i] = "OK"
    end
  end
  if released > 0 then
    touch_worker("null", 0)
    renew_ttls(m.ttl_ms)
  end
  return reply
end
