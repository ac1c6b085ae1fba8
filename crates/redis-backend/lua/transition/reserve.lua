-- transition.lua, part: mode reserve (fresh entries, then reclaim)
-- (The parts are joined in order in src/scripts.rs.)

-- ARGV: max, reclaim_after_ms, single ("1": stop after the first item).
-- Reply: { tail, item... } where tail is "FULL", "NONE", "STOPPED" (the run
-- reached its failure limit: nothing more is handed out) or "CORRUPT" and the
-- items follow flat (no table per item, cheaper to reply): "RANGE", first,
-- packed (a range cut from the main queue: the units from index `first`,
-- packed `unit\tkind\n`, each fresh on main-stream entry "0-<index + 1>",
-- delivery count 1, state 0:0); "FRESH", stream,
-- n, then n groups of entry_id, unit, kind, retry_index, reclaim_count (the
-- entries one XREADGROUP delivered: delivery count 1, not reclaimed; five
-- values each, as every value replied costs Redis CPU); "OK", stream,
-- entry_id, unit, kind, delivery_count, retry_index, reclaim_count, reclaimed
-- (0/1), previous_worker or false (a reclaim); or "FINALIZED", unit (reclaim
-- budget exhausted).
local function reserve(m, max, reclaim_after_ms, single)
  max = tonumber(max)
  reclaim_after_ms = tonumber(reclaim_after_ms)
  -- Fail fast: a stopped run hands nothing out, changes nothing.
  if m.max_failures and m.failed >= m.max_failures then
    return { "STOPPED" }
  end
  local reply = { "NONE" }
  local delivered = 0
  local changed = false
  local current = nil
  -- Entries handed out by this call, per stream. A long-running call must not
  -- reclaim what it has just delivered: their idle time starts now, as in the
  -- memory backend, even when the script itself runs past the timeout.
  -- The sets are built only when the call goes on to reclaim (not in the
  -- steady state, where fresh entries fill the batch): fresh[stream] lists
  -- the ids read fresh.
  local touched, touched_count = nil, { [priority] = 0, [units] = 0 }
  local fresh = {}
  -- Retry elsewhere: whether a worker other than the caller is live (has not
  -- left, and made a transition within reclaim_after); read once, when an
  -- entry marked for another worker than the caller is met.
  -- leasehold_core::queue::RETRY_ALONE_AFTER: how long a marked retry
  -- waits for a worker to join when none other is live.
  local RETRY_ALONE_AFTER_MS = 1000
  local LEFT = ',"left":true}'
  local others_live = nil
  local function another_live()
    if others_live == nil then
      others_live = false
      local all = redis.call("HGETALL", workers)
      for i = 1, #all, 2 do
        local record = all[i + 1]
        local seen = tonumber(string.match(record, '^{"last_seen":(%d+)'))
        if all[i] ~= worker_id and seen and now - seen <= reclaim_after_ms
          and string.sub(record, -#LEFT) ~= LEFT then
          others_live = true
          break
        end
      end
    end
    return others_live
  end
  -- Groups: full when its units pending on workers (its running count, see
  -- `group_started`) reach the limit in its field ("<limit>:<name>").
  local function group_full(group)
    return group and group_running(group) >= (tonumber(string.match(group, "^(%d+):")) or 0)
  end
  -- Ends the call with `tail`, keeping what it has done so far.
  local function finish(tail)
    reply[1] = tail
    if changed then
      touch_worker(current and jstr(current))
      renew_ttls(m.ttl_ms)
    end
    return reply
  end
  local function corrupt()
    return finish("CORRUPT")
  end
  local function touch(stream, entry_id)
    touched[stream][entry_id] = true
    touched_count[stream] = touched_count[stream] + 1
  end

  -- Fresh entries: priority stream first, then main, each read until the
  -- call has its units or the stream has no unread entry. An entry held back
  -- (a retry for another worker, or a unit of a full group) goes to the end
  -- of the priority stream; once one has, the priority stream is read one
  -- entry at a time, and meeting an entry this call moved back ends its
  -- reading (the entry is moved back once more: read is read).
  local moved_back = {}
  local moved_any = false
  do
    local stream = priority
    local wrapped = false
    fresh[stream] = fresh[stream] or {}
    while delivered < max and not wrapped do
      local count = max - delivered
      if stream == priority and moved_any then
        count = 1
      end
      local read = redis.call("XREADGROUP", "GROUP", GROUP, worker_id, "COUNT", count, "STREAMS", stream, ">")
      if type(read) ~= "table" or type(read[1]) ~= "table" or #read[1][2] == 0 then
        break
      end
      local short = stream_short(stream)
      local entries = read[1][2]
      local ids, unit_list, kinds, avoids, sinces, groups = {}, {}, {}, {}, {}, {}
      for i, entry in ipairs(entries) do
        ids[i] = entry[1]
        unit_list[i], kinds[i], avoids[i], sinces[i], groups[i] = entry_unit(entry[2])
        if not unit_list[i] then
          unit_list[i] = ""
        end
        local list = fresh[stream]
        list[#list + 1] = ids[i]
      end
      local states = read_states(unit_list)
      local group = #reply
      reply[group + 1] = "FRESH"
      reply[group + 2] = short
      reply[group + 3] = 0
      for i = 1, #entries do
        local unit, state = unit_list[i], states[i]
        if not state then
          return corrupt()
        end
        local again = stream == priority and moved_back[ids[i]]
        if not again and group_full(groups[i]) then
          -- Its group is full: it waits in `parked` for a place.
          park(stream, ids[i], unit, kinds[i], avoids[i], sinces[i], groups[i])
        elseif again or (avoids[i] == worker_id
            and (now - sinces[i] < math.min(reclaim_after_ms, RETRY_ALONE_AFTER_MS) or another_live())) then
          -- Held back for another worker: to the end of the priority stream.
          redis.call("XACK", stream, GROUP, ids[i])
          local new_id = add_priority(unit, kinds[i], avoids[i], sinces[i], groups[i])
          moved_back[new_id] = true
          moved_any = true
          if again then
            wrapped = true
          end
        else
          group_started(groups[i])
          append_delivered(unit, short, ids[i], state)
          local n = reply[group + 3] + 1
          local r = group + 3 + (n - 1) * 5
          reply[r + 1] = ids[i]
          reply[r + 2] = unit
          reply[r + 3] = kinds[i]
          reply[r + 4] = state.retry_index
          reply[r + 5] = state.reclaim_count
          reply[group + 3] = n
          delivered = delivered + 1
          changed = true
          current = unit
        end
      end
      touched_count[stream] = touched_count[stream] + #entries
    end
  end

  -- The main queue (format 5, ranges.lua): ranges cut from the cursor; a
  -- unit in `special` (in a group, or of a kind the chunks cannot hold) is
  -- delivered on its own, as a pending row of its entry.
  fresh[units] = {}
  while delivered < max and m.cursor < m.total_units do
    if not absent_is_fresh() then
      return corrupt()
    end
    local n = math.min(max - delivered, m.total_units - m.cursor, RANGE_MAX)
    local alone = false
    if m.has_special then
      local next_special = redis.call("ZRANGEBYSCORE", special, m.cursor, m.cursor + n - 1, "LIMIT", 0, 1)[1]
      if next_special then
        next_special = tonumber(next_special)
        alone = next_special == m.cursor
        n = next_special - m.cursor
      end
    end
    if alone then
      local entry_id = main_id(m.cursor)
      local entry = redis.call("XRANGE", units, entry_id, entry_id)[1]
      local unit, kind, group
      if type(entry) == "table" then
        local _
        unit, kind, _, _, group = entry_unit(entry[2])
      end
      local state = unit and read_state(unit)
      if not state then
        return corrupt()
      end
      m.cursor = m.cursor + 1
      redis.call("HSET", meta, "cursor", m.cursor)
      if group_full(group) then
        park(units, entry_id, unit, kind, nil, nil, group)
      else
        redis.call("XCLAIM", units, GROUP, worker_id, 0, entry_id, "RETRYCOUNT", 1, "FORCE", "JUSTID")
        group_started(group)
        append_delivered(unit, "units", entry_id, state)
        local r = #reply
        reply[r + 1], reply[r + 2], reply[r + 3] = "FRESH", "units", 1
        reply[r + 4], reply[r + 5], reply[r + 6] = entry_id, unit, kind
        reply[r + 7], reply[r + 8] = state.retry_index, state.reclaim_count
        local list = fresh[units]
        list[#list + 1] = entry_id
        touched_count[units] = touched_count[units] + 1
        delivered = delivered + 1
        changed = true
        current = unit
      end
    else
      local first = m.cursor
      local packed = cut_range(m, n)
      if not packed then
        return corrupt()
      end
      local r = #reply
      reply[r + 1], reply[r + 2], reply[r + 3] = "RANGE", first, packed
      delivered = delivered + n
      changed = true
      current = unit_at(m.cursor - 1)
    end
  end

  -- Reclaim: the oldest entry idle for at least the timeout, priority first.
  local tail = "NONE"
  if delivered >= max then
    tail = "FULL"
  end
  if delivered < max then
    touched = { [priority] = {}, [units] = {} }
    for stream, ids in pairs(fresh) do
      local set = touched[stream]
      for _, id in ipairs(ids) do
        set[id] = true
      end
    end
  end
  if delivered < max then
    explode_idle(reclaim_after_ms)
    if ranges_lost then
      return corrupt()
    end
  end
  while delivered < max do
    local stream, row
    for _, s in ipairs({ priority, units }) do
      local rows = redis.call("XPENDING", s, GROUP, "IDLE", reclaim_after_ms, "-", "+", touched_count[s] + 1)
      for _, candidate in ipairs(rows) do
        if type(candidate) == "table" and not touched[s][candidate[1]] then
          stream, row = s, candidate
          break
        end
      end
      if stream then
        break
      end
    end
    if not stream then
      tail = "NONE"
      break
    end
    local entry_id, previous = row[1], row[2]
    local range = redis.call("XRANGE", stream, entry_id, entry_id)
    local unit, kind
    if type(range[1]) == "table" then
      unit, kind = entry_unit(range[1][2])
    end
    -- Refuse before moving ownership when the unit's state is gone.
    local state = unit and read_state(unit)
    if not state then
      tail = "CORRUPT"
      break
    end
    redis.call("XCLAIM", stream, GROUP, worker_id, 0, entry_id)
    touch(stream, entry_id)
    local delivery_count = tonumber(row[4]) + 1
    local short = stream_short(stream)
    local unit_json = jstr(unit)
    changed = true
    if state.reclaim_count + 1 > m.max_reclaims then
      finalize_entry(stream, entry_id, unit_json, state, "failed", 0, '"reclaim_budget_exhausted"', "",
        string.format(',"previous_worker_id":%s,"delivery_count":%d', jstr(previous), delivery_count))
      reply[#reply + 1] = "FINALIZED"
      reply[#reply + 1] = unit
      if not state.quarantined then
        m.failed = m.failed + 1
      end
      if m.max_failures and m.failed >= m.max_failures then
        tail = "STOPPED"
        break
      end
      if single == "1" then
        tail = "FULL"
        break
      end
    else
      state.reclaim_count = state.reclaim_count + 1
      write_state(unit, state)
      append_json(event_head("reclaimed", unit_json, state) .. string.format(
        ',"previous_worker_id":%s,"stream":"%s","entry_id":"%s","delivery_count":%d}',
        jstr(previous), short, entry_id, delivery_count))
      for _, v in ipairs({ "OK", short, entry_id, unit, kind, delivery_count, state.retry_index, state.reclaim_count, 1,
        previous or false }) do
        reply[#reply + 1] = v
      end
      delivered = delivered + 1
      current = unit
      if delivered >= max then
        tail = "FULL"
      end
    end
  end
  return finish(tail)
end
