-- transition.lua, part: the dispatch, and the call itself
-- (The parts are joined in order in src/scripts.rs.)

-- ---------------------------------------------------------------------------
-- Dispatch
-- ---------------------------------------------------------------------------

local function dispatch()
  if mode == "worker_error" or mode == "stale_rejected" then
    return append_prebuilt_event(ARGV[3], ARGV[4])
  end

  local m = read_meta()
  if not m then
    return CORRUPT
  end
  has_groups = m.has_groups

  if mode == "reserve" then
    return reserve(m, ARGV[3], ARGV[4], ARGV[5])
  elseif mode == "heartbeat_batch" then
    return heartbeat_batch(m, ARGV[3], 4)
  elseif mode == "finalize_batch" then
    return finalize_batch(m, ARGV[3], 4)
  elseif mode == "requeue" then
    return requeue(m, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12])
  elseif mode == "abandoned" then
    return abandoned(m, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
  elseif mode == "release_batch" then
    return release_batch(m, ARGV[3], 4)
  elseif mode == "liveness" then
    return liveness(m, ARGV[3])
  elseif mode == "leave" then
    return leave(m)
  end
  return redis.error_reply("ERR unknown transition mode " .. tostring(mode))
end

local result = dispatch()
-- Every path that appends events renews the TTLs (and so flushes them);
-- this is a safety net.
flush_events()
return result
