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

-- Sets one call's state: its keys, arguments and clock, and empty caches.
local function begin(keys, args)
  KEYS, ARGV = keys, args
  units, priority, attempts, meta, unit_state, workers, parked =
    keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
  chunks, special, ranges, starts, clocks = keys[8], keys[9], keys[10], keys[11], keys[12]
  mode, worker_id = args[1], args[2]
  has_groups = false
  local time = redis.call("TIME")
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  worker_json = jstr(worker_id)
  now_str = string.format("%d", now)
  head_suffix = {}
  sparse = nil
  chunk_cache, range_cache, ranges_lost = {}, {}, false
  ev_reset()
end

-- FUNCTION_NAME is set by the first line the loader puts before this code
-- (src/scripts.rs): it names this exact code, so versions that share one
-- Redis never call each other's transitions.
redis.register_function(FUNCTION_NAME, function(keys, args)
  begin(keys, args)
  local result = dispatch()
  -- Every path that appends events renews the TTLs (and so flushes them);
  -- this is a safety net.
  flush_events()
  return result
end)
