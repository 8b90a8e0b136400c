-- ARGV: prefix, now_ms, limit, recheck_ms, short_ms.
-- Places up to `limit` due requests in one atomic step: for each, the first preference
-- group (in order, once its not-before time has come) with a fitting worker wins, and
-- within the group the fullest fitting worker. Being one script, two schedulers sharing
-- this Redis can never place a request twice or overcommit a worker.
-- A CPU-only call of a short function (common.lua `short`, short_ms) that fits in no worker's room is
-- queued on a worker instead, when the first open group with one has a worker whose own queue has room
-- (the shortest queue; the worker must be able to run it at all, and be expected to start it within
-- short_ms): it waits there, state `waiting`, and gets the first room that frees on that worker
-- (common.lua `promote`). Placed means "runs there next".
-- Returns {placed: request, worker, pool, queued ('1' or '0') per request; unplaced ids}.
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local recheck = tonumber(ARGV[4])
local short_ms = tonumber(ARGV[5] or '0') or 0
local backlog = P .. 'backlog'

local function fit(pool, cpu, mem, gpus)
  local idx = P .. 'idx:' .. pool
  local lower = gpus * GPU_UNIT + math.min(cpu, GPU_UNIT - 1)
  local offset = 0
  while true do
    local page = redis.call('ZRANGEBYSCORE', idx, lower, '+inf', 'WITHSCORES', 'LIMIT', offset, 32)
    if #page == 0 then return nil end
    local dropped = 0
    for i = 1, #page, 2 do
      local wid = page[i]
      local w = redis.call('HMGET', wkey(wid), 'cpu_free', 'mem_free', 'gpu_free', 'status')
      if w[4] ~= 'running' or redis.call('EXISTS', P .. 'alive:' .. wid) == 0 then
        -- gone quiet or draining: out of the index; the reaper requeues a dead worker's work
        redis.call('ZREM', idx, wid)
        dropped = dropped + 1
      elseif tonumber(w[1]) >= cpu and tonumber(w[2]) >= mem and tonumber(w[3]) >= gpus then
        return wid, tonumber(page[i + 1])
      end
    end
    offset = offset + #page / 2 - dropped
  end
end

-- The worker of `pool` with the shortest queue that still has room, could ever run the call, and would
-- start it within short_ms as expected: (calls ahead + 1) x the function's mean duration `dur`, shared among
-- the calls it runs at once.
local function queue_fit(pool, cpu, mem, dur)
  local qidx = P .. 'qidx:' .. pool
  for _ = 1, 4 do
    local page = redis.call('ZRANGE', qidx, 0, 31, 'WITHSCORES')
    if #page == 0 then return nil end
    local dropped = 0
    for i = 1, #page, 2 do
      local wid = page[i]
      local w = redis.call('HMGET', wkey(wid), 'cpu_total', 'mem_total', 'status', 'running')
      if w[3] ~= 'running' or redis.call('EXISTS', P .. 'alive:' .. wid) == 0 then
        redis.call('ZREM', qidx, wid)
        dropped = dropped + 1
      elseif tonumber(w[1]) >= cpu and tonumber(w[2]) >= mem
          and (tonumber(page[i + 1]) + 1) * dur <= math.max(tonumber(w[4]) or 0, 1) * short_ms then
        return wid, tonumber(page[i + 1])
      end
    end
    if dropped == 0 then return nil end  -- a full page of workers too small for it: not queued
  end
  return nil
end

local due = redis.call('ZRANGEBYSCORE', backlog, '-inf', now, 'LIMIT', 0, limit)
local placed, unplaced = {}, {}
-- Capacity only shrinks during one pass, so once a request of some shape (groups, cpu, memory)
-- found no worker, every later one of the same shape would not either: a map of thousands of
-- identical calls waiting on a few busy workers costs one search per pass, not thousands.
local hopeless = {}
-- likewise, once a shape (with its function) found no worker queue with room, later ones skip that search
local unqueueable = {}
for _, rid in ipairs(due) do
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'gpus', 'groups', 'enq', 'state', 'fn')
  if not r[1] or r[6] ~= 'queued' then
    redis.call('ZREM', backlog, rid)
  else
    local cpu, mem, gpus = tonumber(r[1]), tonumber(r[2]), 0
    local best, best_score, best_pool
    local next_gate
    local shape = r[4] .. '/' .. r[1] .. '/' .. r[2] .. '/' .. (r[7] or '')
    local groups = split(r[4], '|')
    local gate = hopeless[shape]
    if gate ~= nil then
      groups = {}
      if gate ~= 0 then next_gate = gate end
    end
    for _, group in ipairs(groups) do
      local nb, g, list = string.match(group, '^(%d+);(%d+);(.*)$')
      nb = tonumber(nb)
      if nb <= now then
        for _, pool in ipairs(split(list, ',')) do
          local wid, s = fit(pool, cpu, mem, tonumber(g))
          if wid and (not best or s < best_score) then best, best_score, best_pool, gpus = wid, s, pool, tonumber(g) end
        end
        if best then break end
      elseif not next_gate or nb < next_gate then
        next_gate = nb
      end
    end
    local waiting = false
    if not best and r[3] == '0' and not unqueueable[shape] and short(r[7], short_ms) then
      for _, group in ipairs(split(r[4], '|')) do
        local nb, g, list = string.match(group, '^(%d+);(%d+);(.*)$')
        if tonumber(nb) <= now and g == '0' then
          for _, pool in ipairs(split(list, ',')) do
            local wid, s = queue_fit(pool, cpu, mem, tonumber(redis.call('HGET', P .. 'dur', r[7])))
            if wid and (not best or s < best_score) then best, best_score, best_pool = wid, s, pool end
          end
          if best then break end
        end
      end
      if best then waiting = true else unqueueable[shape] = true end
    end
    if waiting then
      local key = wkey(best)
      redis.call('HINCRBY', key, 'queued', 1)
      redis.call('RPUSH', P .. 'wqq:' .. best, rid)
      reindex(best, best_pool)
      redis.call('ZREM', backlog, rid)
      redis.call('HSET', rkey, 'state', 'waiting', 'worker', best, 'pool', best_pool, 'held', 0, 'taken', 0,
        'long', 0)
      redis.call('RPUSH', P .. 'wq:' .. best, rid)
      redis.call('SADD', P .. 'wr:' .. best, rid)
      unmet_rem(rid, r[4])
      placed[#placed + 1] = rid
      placed[#placed + 1] = best
      placed[#placed + 1] = best_pool
      placed[#placed + 1] = '1'
    elseif best then
      local key = wkey(best)
      local long = short(r[7], short_ms) and 0 or 1
      redis.call('HINCRBY', key, 'cpu_free', 0 - cpu)
      redis.call('HINCRBY', key, 'mem_free', 0 - mem)
      redis.call('HINCRBY', key, 'gpu_free', 0 - gpus)  -- not -gpus: Lua's -0 reaches Redis as "-0", not an integer
      redis.call('HINCRBY', key, 'running', 1)
      redis.call('HINCRBY', key, 'long', long)
      redis.call('HSET', key, 'idle_since', 0)
      reindex(best, best_pool)
      redis.call('ZREM', backlog, rid)
      redis.call('HSET', rkey, 'state', 'placed', 'worker', best, 'pool', best_pool, 'held', gpus, 'start', now,
        'long', long)
      redis.call('RPUSH', P .. 'wq:' .. best, rid)
      redis.call('SADD', P .. 'wr:' .. best, rid)
      unmet_rem(rid, r[4])
      placed[#placed + 1] = rid
      placed[#placed + 1] = best
      placed[#placed + 1] = best_pool
      placed[#placed + 1] = '0'
    else
      if hopeless[shape] == nil then hopeless[shape] = next_gate or 0 end
      local again = now + recheck
      if next_gate and next_gate < again then again = next_gate end
      redis.call('ZADD', backlog, again, rid)
      unmet_add(rid, r[4], r[5])
      unplaced[#unplaced + 1] = rid
    end
  end
end
return {placed, unplaced}
