-- Shared by every levers9 script; the host prepends it. ARGV[1] is the key prefix.
-- Scripts touch keys they compute from ids, so levers9 needs one Redis (or a primary
-- with replicas / Sentinel), not Redis Cluster.
local P = ARGV[1]
-- A worker's index score packs free GPUs above free CPU millicores, so one range query
-- finds the fullest worker with enough GPUs and CPU (best fit, so idle workers drain).
local GPU_UNIT = 2097152

local function split(s, sep)
  local out = {}
  if not s then return out end
  for part in string.gmatch(s, '[^' .. sep .. ']+') do out[#out + 1] = part end
  return out
end

local function wkey(wid) return P .. 'w:' .. wid end

local function score(cpu_free, gpu_free)
  return gpu_free * GPU_UNIT + math.min(math.max(cpu_free, 0), GPU_UNIT - 1)
end

-- Keep a worker's index entries in step with its hash. idx:<pool> lists the workers that take work into free
-- room: running, and no call waiting in their own queue (a queued call gets the room that frees first).
-- qidx:<pool> lists those that may queue another call: running, a queue bound (q_max) not reached, and no
-- call of a function that runs long on them (no queue forms behind a long call); scored by queue length.
local function reindex(wid, pool)
  local w = redis.call('HMGET', wkey(wid), 'cpu_free', 'gpu_free', 'status', 'queued', 'q_max', 'long')
  local queued, q_max, long = tonumber(w[4] or 0) or 0, tonumber(w[5] or 0) or 0, tonumber(w[6] or 0) or 0
  if w[3] == 'running' and queued == 0 then
    redis.call('ZADD', P .. 'idx:' .. pool, score(tonumber(w[1]), tonumber(w[2])), wid)
  else
    redis.call('ZREM', P .. 'idx:' .. pool, wid)
  end
  if w[3] == 'running' and queued < q_max and long == 0 then
    redis.call('ZADD', P .. 'qidx:' .. pool, queued, wid)
  else
    redis.call('ZREM', P .. 'qidx:' .. pool, wid)
  end
end

-- groups: "NOT_BEFORE_MS;GPUS;pool,pool|NOT_BEFORE_MS;GPUS;pool" in preference order; GPUS is
-- what the request takes on that group's workers (0 on a CPU fallback).
local function pools_of(groups)
  local out = {}
  for _, group in ipairs(split(groups, '|')) do
    local list = string.match(group, '^%d+;%d+;(.*)$')
    for _, pool in ipairs(split(list, ',')) do out[#out + 1] = pool end
  end
  return out
end

local function unmet_add(rid, groups, enq)
  redis.call('ZADD', P .. 'unmet', enq, rid)
  for _, pool in ipairs(pools_of(groups)) do redis.call('ZADD', P .. 'unmet:' .. pool, enq, rid) end
end

local function unmet_rem(rid, groups)
  redis.call('ZREM', P .. 'unmet', rid)
  for _, pool in ipairs(pools_of(groups)) do redis.call('ZREM', P .. 'unmet:' .. pool, rid) end
end

-- A function's calls count as short when their mean duration, as measured here, is known and at most
-- `bound` ms: only those are queued on a worker (0 disables queueing).
local function short(fn, bound)
  if bound <= 0 or not fn or fn == '' then return false end
  local d = redis.call('HGET', P .. 'dur', fn)
  return d ~= false and d ~= nil and tonumber(d) <= bound
end

-- A finished call teaches its function's mean duration (exponentially weighted, newest 1/5).
local function learn(fn, start, now)
  if not fn or fn == '' or not start or tonumber(start) <= 0 then return end
  local took = math.max(now - tonumber(start), 0)
  local d = tonumber(redis.call('HGET', P .. 'dur', fn) or '')
  redis.call('HSET', P .. 'dur', fn, d and (d * 0.8 + took * 0.2) or took)
end

-- Move the calls waiting in a worker's own queue into the room it has, oldest first, stopping at the first
-- that does not fit: the worker starts them in the same order as its own room frees, so both agree on
-- what runs. A call already taken by the worker counts as running, one not yet taken as placed.
local function promote(wid, now)
  local key, queue = wkey(wid), P .. 'wqq:' .. wid
  while true do
    local rid = redis.call('LINDEX', queue, 0)
    if not rid then return end
    local rkey = P .. 'r:' .. rid
    local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'state', 'worker', 'taken')
    if r[3] ~= 'waiting' or r[4] ~= wid then
      redis.call('LPOP', queue)  -- finished or moved meanwhile: no longer waiting here
    else
      local w = redis.call('HMGET', key, 'cpu_free', 'mem_free')
      if tonumber(w[1]) < tonumber(r[1]) or tonumber(w[2]) < tonumber(r[2]) then return end
      redis.call('LPOP', queue)
      redis.call('HINCRBY', key, 'cpu_free', 0 - tonumber(r[1]))
      redis.call('HINCRBY', key, 'mem_free', 0 - tonumber(r[2]))
      redis.call('HINCRBY', key, 'running', 1)
      redis.call('HINCRBY', key, 'queued', -1)
      redis.call('HSET', key, 'idle_since', 0)
      redis.call('HSET', rkey, 'state', r[5] == '1' and 'running' or 'placed', 'start', now, 'long', 0)
    end
  end
end

-- Give a request's resources back to its worker (if the worker is still known), and the room freed to
-- the calls waiting in its queue.
local function give_back(wid, pool, cpu, mem, gpus, now, long)
  local key = wkey(wid)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'cpu_free', cpu)
    redis.call('HINCRBY', key, 'mem_free', mem)
    redis.call('HINCRBY', key, 'gpu_free', gpus)
    if long == '1' then redis.call('HINCRBY', key, 'long', -1) end
    if redis.call('HINCRBY', key, 'running', -1) <= 0 then
      redis.call('HSET', key, 'running', 0, 'idle_since', now)
    end
    promote(wid, now)
    reindex(wid, pool)
  end
end

-- A call waiting in a worker's own queue leaves it (finished, cancelled, or put back on the backlog).
local function unqueue(rid, wid, pool)
  local key = wkey(wid)
  redis.call('LREM', P .. 'wqq:' .. wid, 0, rid)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'queued', -1)
    reindex(wid, pool)
  end
end

-- A request leaves its worker: resources back (or its place in the worker's queue), off the worker's lists.
-- Returns true when it held a place (room was freed).
local function release(rid, r_state, wid, pool, cpu, mem, gpus, long, now)
  if wid == '' then return false end
  local held = r_state == 'placed' or r_state == 'running'
  if held then
    give_back(wid, pool, cpu, mem, gpus, now, long)
  elseif r_state == 'waiting' then
    unqueue(rid, wid, pool)
  end
  redis.call('SREM', P .. 'wr:' .. wid, rid)
  redis.call('LREM', P .. 'wq:' .. wid, 0, rid)
  return held
end
