-- ARGV: prefix, worker id, now_ms, then the ids of the requests the worker says it holds.
-- A worker registered again (the replica it talked to went away) and said which requests it holds: those it
-- runs and those whose results it has yet to deliver. A request it had taken (state running) but does not
-- hold never reached it: a replica sent it into a session that was breaking. Such a request goes back on the
-- backlog and its resources back to the worker; one taken from the worker's own queue (state waiting) but not
-- held leaves that queue for the backlog. Requests not taken yet (state placed, or waiting untaken) stay there
-- for its new session to take. A held request Redis kept for the worker after losing its data (an 'orphan',
-- see orphan.lua) is its own again: running there, holding its room. Returns {requeued ids, ids still on the
-- worker that it holds}.
local wid, now = ARGV[2], tonumber(ARGV[3])
local held = {}
for i = 4, #ARGV do held[ARGV[i]] = true end
local pool = redis.call('HGET', wkey(wid), 'pool')
local requeued, kept = {}, {}
if not pool then return {requeued, kept} end
for _, rid in ipairs(redis.call('SMEMBERS', P .. 'wr:' .. wid)) do
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker', 'taken', 'long')
  local taken = r[4] == 'running' or (r[4] == 'waiting' and r[6] == '1')
  if r[5] == wid and taken and not held[rid] then
    release(rid, r[4], wid, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), r[7], now)
    redis.call('HSET', rkey, 'state', 'queued', 'worker', '', 'pool', '', 'taken', 0)
    if r[4] == 'running' then redis.call('HINCRBY', rkey, 'attempts', 1) end
    redis.call('ZADD', P .. 'backlog', now, rid)
    requeued[#requeued + 1] = rid
  elseif r[5] == wid and held[rid] then
    kept[#kept + 1] = rid
  end
end
local key = wkey(wid)
for i = 4, #ARGV do
  local rid = ARGV[i]
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker')
  if r[4] == 'orphan' and r[5] == wid then
    redis.call('HINCRBY', key, 'cpu_free', 0 - tonumber(r[1]))
    redis.call('HINCRBY', key, 'mem_free', 0 - tonumber(r[2]))
    redis.call('HINCRBY', key, 'gpu_free', 0 - tonumber(r[3]))
    redis.call('HINCRBY', key, 'running', 1)
    redis.call('HINCRBY', key, 'long', 1)  -- how long it has run is unknown: no queue forms behind it
    redis.call('HSET', key, 'idle_since', 0)
    redis.call('HSET', rkey, 'state', 'running', 'pool', pool, 'start', now, 'long', 1, 'taken', 0)
    redis.call('SADD', P .. 'wr:' .. wid, rid)
    redis.call('ZREM', P .. 'orphans', rid)
    kept[#kept + 1] = rid
  end
end
reindex(wid, pool)
return {requeued, kept}
