-- ARGV: prefix, sandbox id, now_ms.
-- The sandbox ended: the room it held goes back to its worker (and to the calls waiting in the worker's
-- queue), if the worker is still known. Returns 1 when a hold was released, 0 when there was none.
local sid, now = ARGV[2], tonumber(ARGV[3])
local hkey = P .. 'sbh:' .. sid
local h = redis.call('HMGET', hkey, 'worker', 'pool', 'cpu', 'mem', 'gpus')
if not h[1] then return 0 end
redis.call('DEL', hkey)
redis.call('SREM', P .. 'wsb:' .. h[1], sid)
give_back(h[1], h[2], tonumber(h[3]), tonumber(h[4]), tonumber(h[5]), now, '1')
return 1
