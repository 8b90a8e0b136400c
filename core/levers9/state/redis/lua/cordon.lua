-- ARGV: prefix, id.
-- Stops placing on a worker whatever it runs (it is shutting down and finishes what it has). The calls
-- waiting in its own queue go back on the backlog, due at once: a draining worker drops its queue (one it
-- had taken counts an attempt, as it may have started). Returns 1 when the worker is known, 0 when it is not.
local wid = ARGV[2]
local key = wkey(wid)
local pool = redis.call('HGET', key, 'pool')
if not pool then return 0 end
redis.call('HSET', key, 'status', 'draining')
for _, rid in ipairs(redis.call('LRANGE', P .. 'wqq:' .. wid, 0, -1)) do
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'state', 'worker', 'taken')
  if r[1] == 'waiting' and r[2] == wid then
    release(rid, 'waiting', wid, pool, 0, 0, 0, '0', 0)
    redis.call('HSET', rkey, 'state', 'queued', 'worker', '', 'pool', '', 'taken', 0)
    if r[3] == '1' then redis.call('HINCRBY', rkey, 'attempts', 1) end
    redis.call('ZADD', P .. 'backlog', 0, rid)
  end
end
redis.call('DEL', P .. 'wqq:' .. wid)
reindex(wid, pool)
return 1
