-- ARGV: prefix, then per request 10 values: id, ready_ms, cpu, mem, gpus, groups, enqueued_ms, workspace,
-- deadline_ms (when the planner gives up on it), function (the stub whose call it is; '' for none: never
-- queued on a worker).
-- A request already known (queued, placed or running) is left alone, so replaying SQL's
-- unfinished tasks after a restart never queues one twice.
local added = 0
for i = 2, #ARGV, 10 do
  local rid = ARGV[i]
  local rkey = P .. 'r:' .. rid
  if redis.call('EXISTS', rkey) == 0 then
    redis.call('HSET', rkey, 'cpu', ARGV[i + 2], 'mem', ARGV[i + 3], 'gpus', ARGV[i + 4], 'groups', ARGV[i + 5],
      'enq', ARGV[i + 6], 'ws', ARGV[i + 7], 'deadline', ARGV[i + 8], 'state', 'queued', 'attempts', 0,
      'fn', ARGV[i + 9])
    redis.call('ZADD', P .. 'backlog', ARGV[i + 1], rid)
    added = added + 1
  end
end
return added
