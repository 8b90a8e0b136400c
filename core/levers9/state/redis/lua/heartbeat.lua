-- ARGV: prefix, id, now_ms, ttl_ms. Returns 0 when the worker was already reaped: it must register again.
local wid = ARGV[2]
if redis.call('EXISTS', wkey(wid)) == 0 then return 0 end
redis.call('SET', P .. 'alive:' .. wid, ARGV[3], 'PX', ARGV[4])
return 1
