-- ARGV: prefix, until_ms, then per request 12 values: id, cpu, mem, gpus, groups, enqueued_ms, workspace,
-- deadline_ms, function, worker, pool, held (the GPUs it takes on that pool).
-- After Redis lost its data (a controlplane restart with the embedded Redis, or a Redis restart), SQL says
-- these requests run on workers Redis no longer knows. Each is kept for its worker ('orphan': holding no
-- room, in no queue) until until_ms: a worker that registers again holding it gets it back (reclaim.lua),
-- so its call is neither killed nor run twice; one whose worker does not come back is queued again
-- (orphans_due.lua). A request Redis knows is left alone. Returns how many were kept.
local until_ms = ARGV[2]
local kept = 0
for i = 3, #ARGV, 12 do
  local rid = ARGV[i]
  local rkey = P .. 'r:' .. rid
  if redis.call('EXISTS', rkey) == 0 then
    redis.call('HSET', rkey, 'cpu', ARGV[i + 1], 'mem', ARGV[i + 2], 'gpus', ARGV[i + 3], 'groups', ARGV[i + 4],
      'enq', ARGV[i + 5], 'ws', ARGV[i + 6], 'deadline', ARGV[i + 7], 'state', 'orphan', 'attempts', 0,
      'fn', ARGV[i + 8], 'worker', ARGV[i + 9], 'pool', ARGV[i + 10], 'held', ARGV[i + 11])
    redis.call('ZADD', P .. 'orphans', until_ms, rid)
    kept = kept + 1
  end
end
return kept
