-- ARGV: prefix, worker id, now_ms, then the ids of the requests the worker says it holds.
-- A worker registered again (the replica it talked to went away) and said which requests it holds: those it
-- runs and those whose results it has yet to deliver. A request it had taken (state running) but does not
-- hold never reached it: a replica sent it into a session that was breaking. Such a request goes back on the
-- backlog and its resources back to the worker. Requests still waiting in the worker's queue (state placed)
-- stay there for its new session to take. Returns {requeued ids, ids still on the worker that it holds}.
local wid, now = ARGV[2], tonumber(ARGV[3])
local held = {}
for i = 4, #ARGV do held[ARGV[i]] = true end
local pool = redis.call('HGET', wkey(wid), 'pool')
local requeued, kept = {}, {}
if not pool then return {requeued, kept} end
for _, rid in ipairs(redis.call('SMEMBERS', P .. 'wr:' .. wid)) do
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker')
  if r[5] == wid and r[4] == 'running' and not held[rid] then
    give_back(wid, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), now)
    redis.call('SREM', P .. 'wr:' .. wid, rid)
    redis.call('HSET', rkey, 'state', 'queued', 'worker', '', 'pool', '')
    redis.call('HINCRBY', rkey, 'attempts', 1)
    redis.call('ZADD', P .. 'backlog', now, rid)
    requeued[#requeued + 1] = rid
  elseif r[5] == wid and held[rid] then
    kept[#kept + 1] = rid
  end
end
return {requeued, kept}
