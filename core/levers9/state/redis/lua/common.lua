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

-- Keep a worker's index entry in step with its hash: indexed only while it takes work.
local function reindex(wid, pool)
  local w = redis.call('HMGET', wkey(wid), 'cpu_free', 'gpu_free', 'status')
  if w[3] == 'running' then
    redis.call('ZADD', P .. 'idx:' .. pool, score(tonumber(w[1]), tonumber(w[2])), wid)
  else
    redis.call('ZREM', P .. 'idx:' .. pool, wid)
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

-- Give a request's resources back to its worker (if the worker is still known).
local function give_back(wid, pool, cpu, mem, gpus, now)
  local key = wkey(wid)
  if redis.call('EXISTS', key) == 1 then
    redis.call('HINCRBY', key, 'cpu_free', cpu)
    redis.call('HINCRBY', key, 'mem_free', mem)
    redis.call('HINCRBY', key, 'gpu_free', gpus)
    if redis.call('HINCRBY', key, 'running', -1) <= 0 then
      redis.call('HSET', key, 'running', 0, 'idle_since', now)
    end
    reindex(wid, pool)
  end
end
