-- ARGV: prefix, request id, now_ms.
-- The request is done (finished, cancelled or given up): its worker gets the resources back (the room
-- going to the calls waiting in its queue), or the request leaves that queue, and every trace of it leaves
-- Redis. Returns {previous state, worker, pool} or {} when unknown.
local rid, now = ARGV[2], tonumber(ARGV[3])
local rkey = P .. 'r:' .. rid
local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker', 'pool', 'groups', 'long', 'fn', 'start')
if not r[1] then return {} end
local worker, pool = r[5] or '', r[6] or ''
if release(rid, r[4], worker, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), r[8], now) then
  learn(r[9], r[10], now)
end
redis.call('ZREM', P .. 'backlog', rid)
unmet_rem(rid, r[7])
redis.call('DEL', rkey)
return {r[4], worker, pool}
