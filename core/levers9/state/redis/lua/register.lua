-- ARGV: prefix, id, pool, gpu, gpu_count, cpu, mem, runtime, machine, address, workspace, now_ms, ttl_ms, tunnel
-- ('1' when the controlplane cannot connect to the worker, decided again at every registration), q_max (how
-- many calls it may hold waiting in its own queue beyond what it runs; 0: none).
-- A worker joins (or rejoins after a network blip, keeping the work already on it).
local wid = ARGV[2]
local key = wkey(wid)
local pool = ARGV[3]
if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'pool', pool, 'gpu', ARGV[4], 'gpu_total', ARGV[5], 'gpu_free', ARGV[5],
    'cpu_total', ARGV[6], 'cpu_free', ARGV[6], 'mem_total', ARGV[7], 'mem_free', ARGV[7], 'runtime', ARGV[8],
    'machine', ARGV[9], 'address', ARGV[10], 'ws', ARGV[11], 'registered', ARGV[12], 'idle_since', ARGV[12],
    'running', 0, 'status', 'running', 'tunnel', ARGV[14], 'q_max', ARGV[15] or 0, 'queued', 0, 'long', 0)
else
  redis.call('HSET', key, 'address', ARGV[10], 'tunnel', ARGV[14], 'q_max', ARGV[15] or 0)
end
redis.call('SADD', P .. 'workers', wid)
redis.call('SADD', P .. 'pool:' .. pool, wid)
redis.call('SET', P .. 'alive:' .. wid, ARGV[12], 'PX', ARGV[13])
reindex(wid, pool)
return redis.call('HGET', key, 'status')
