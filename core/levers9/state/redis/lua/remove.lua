-- ARGV: prefix, id, now_ms, force (1 or 0).
-- Takes a worker out of the registry and puts the work it held back on the backlog, the calls waiting in its
-- own queue too.
-- Without force it does nothing while the worker's keepalive stands, so a reaper racing
-- a late heartbeat never kills a live worker. Returns the requeued request ids.
local wid, now, force = ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1'
if not force and redis.call('EXISTS', P .. 'alive:' .. wid) == 1 then return false end
local key = wkey(wid)
local pool = redis.call('HGET', key, 'pool')
local requeued = {}
for _, rid in ipairs(redis.call('SMEMBERS', P .. 'wr:' .. wid)) do
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'worker', 'state', 'taken')
  if r[1] == wid then
    redis.call('HSET', rkey, 'state', 'queued', 'worker', '', 'pool', '', 'taken', 0)
    -- a call that waited in the worker's queue and never reached it did not run: no attempt spent
    if r[2] ~= 'waiting' or r[3] == '1' then redis.call('HINCRBY', rkey, 'attempts', 1) end
    redis.call('ZADD', P .. 'backlog', now, rid)
    requeued[#requeued + 1] = rid
  end
end
-- its sandboxes ended with it: their holds go
for _, sid in ipairs(redis.call('SMEMBERS', P .. 'wsb:' .. wid)) do redis.call('DEL', P .. 'sbh:' .. sid) end
redis.call('DEL', P .. 'wsb:' .. wid)
redis.call('DEL', key, P .. 'wr:' .. wid, P .. 'wq:' .. wid, P .. 'wqq:' .. wid, P .. 'alive:' .. wid)
redis.call('SREM', P .. 'workers', wid)
if pool then
  redis.call('SREM', P .. 'pool:' .. pool, wid)
  redis.call('ZREM', P .. 'idx:' .. pool, wid)
  redis.call('ZREM', P .. 'qidx:' .. pool, wid)
end
return requeued
