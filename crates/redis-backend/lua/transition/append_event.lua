-- transition.lua, part: modes worker_error and stale_rejected
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: client-built event JSON without its closing brace (at_ms is stamped
-- here), the TTL for a log of a run that does not exist yet.
-- Not fenced, does not require meta.
local function append_prebuilt_event(body, orphan_ttl_ms)
  append_json(body .. ',"at_ms":' .. string.format("%d", now) .. "}")
  local ttl = tonumber(redis.call("HGET", meta, "ttl_ms")) or tonumber(orphan_ttl_ms)
  renew_ttls(ttl)
  return { "OK" }
end
