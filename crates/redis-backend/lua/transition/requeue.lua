-- transition.lua, part: mode requeue
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: stream, entry_id, delivery_count, unit_id, unit_type, duration_ms,
--       failure_summary_json, errors_json, elsewhere ("1": mark the retry
--       to go to another worker than this one), slot_field (`,"slot":N`
--       or "", put in the event as it is).
local function requeue(m, short, entry_id, delivery_count, unit_id, unit_type, duration_ms, summary_json, errors_json,
                       elsewhere, slot_field)
  slot_field = slot_field or ""
  if not settle(stream_key(short), entry_id) then
    return CORRUPT
  end
  local stream, state, row = fenced_state(short, entry_id, delivery_count, unit_id)
  if not stream then
    return state
  end
  local unit_json = jstr(unit_id)
  -- Subtracting an epsilon keeps ceil(100 * 0.7) at 70, not 71.
  local max_units = math.max(0, math.ceil(m.total_units * m.requeue_tolerance - 1e-9))
  local over_unit_cap = state.retry_index + 1 > m.max_requeues
  local over_tolerance = (not state.entered_retry) and m.requeued_units >= max_units

  if over_unit_cap or over_tolerance then
    finalize_entry(stream, entry_id, unit_json, state, "failed", duration_ms, '"retry_budget_exhausted"', errors_json,
      ',"failure_summary":' .. raw_or_null(summary_json) .. slot_field)
    touch_worker("null", 1)
    renew_ttls(m.ttl_ms)
    return { "FINALIZED", state.retry_index }
  end

  if not state.entered_retry then
    state.entered_retry = true
    redis.call("HINCRBY", meta, "requeued_units_count", 1)
  end
  local previous_retry_index = state.retry_index
  state.retry_index = state.retry_index + 1
  write_state(unit_id, state)
  redis.call("XACK", stream, GROUP, entry_id)
  local avoid = nil
  if elsewhere == "1" then
    avoid = worker_id
  end
  local new_entry_id = add_priority(unit_id, unit_type, avoid, now, row.group)
  group_freed(row.group)
  append_json(event_head("requeued", unit_json, state) .. string.format(
    ',"previous_retry_index":%d,"duration_ms":%d,"failure_summary":%s,"errors":%s,"stream":"%s","entry_id":"%s","new_entry_id":"%s"%s}',
    previous_retry_index, tonumber(duration_ms) or 0, raw_or_null(summary_json), raw_or_null(errors_json), short,
    entry_id, new_entry_id, slot_field))
  touch_worker("null", 1)
  renew_ttls(m.ttl_ms)
  return { "REQUEUED", state.retry_index }
end
