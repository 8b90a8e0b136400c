-- ARGV: prefix, sandbox id, worker, cpu, mem, gpus, now_ms, workspace.
-- A sandbox about to start on `worker` takes its room there, as a placed call does, when the worker is
-- running, alive and has that much free: the scheduler then places no call into it, and a worker running
-- sandboxes is never idle (never released for idleness). The hold is kept under sbh:<sandbox> and in the
-- worker's set wsb:<worker> (removing the worker drops its holds). Returns 1 when held, 0 when it does not fit.
local sid, wid = ARGV[2], ARGV[3]
local cpu, mem, gpus, now = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local hkey = P .. 'sbh:' .. sid
if redis.call('EXISTS', hkey) == 1 then return 1 end
local key = wkey(wid)
local w = redis.call('HMGET', key, 'cpu_free', 'mem_free', 'gpu_free', 'status', 'pool')
if not w[4] or w[4] ~= 'running' or redis.call('EXISTS', P .. 'alive:' .. wid) == 0 then return 0 end
if tonumber(w[1]) < cpu or tonumber(w[2]) < mem or tonumber(w[3]) < gpus then return 0 end
redis.call('HINCRBY', key, 'cpu_free', 0 - cpu)
redis.call('HINCRBY', key, 'mem_free', 0 - mem)
redis.call('HINCRBY', key, 'gpu_free', 0 - gpus)
redis.call('HINCRBY', key, 'running', 1)
redis.call('HINCRBY', key, 'long', 1)
redis.call('HSET', key, 'idle_since', 0)
reindex(wid, w[5])
redis.call('HSET', hkey, 'worker', wid, 'pool', w[5], 'cpu', cpu, 'mem', mem, 'gpus', gpus, 'since', now,
  'ws', ARGV[8] or '')
redis.call('SADD', P .. 'wsb:' .. wid, sid)
return 1
