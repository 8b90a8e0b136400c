-- ARGV: prefix, request id, now_ms.
-- The request is done (finished, cancelled or given up): its worker gets the resources
-- back and every trace of it leaves Redis. Returns {previous state, worker, pool} or {} when unknown.
local rid, now = ARGV[2], tonumber(ARGV[3])
local rkey = P .. 'r:' .. rid
local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker', 'pool', 'groups')
if not r[1] then return {} end
local worker, pool = r[5] or '', r[6] or ''
if (r[4] == 'placed' or r[4] == 'running') and worker ~= '' then
  give_back(worker, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), now)
  redis.call('SREM', P .. 'wr:' .. worker, rid)
  redis.call('LREM', P .. 'wq:' .. worker, 0, rid)
end
redis.call('ZREM', P .. 'backlog', rid)
unmet_rem(rid, r[7])
redis.call('DEL', rkey)
return {r[4], worker, pool}
