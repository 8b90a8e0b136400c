-- ARGV: prefix, id, now_ms, ttl_ms. Returns 0 when the worker was already reaped: it must register again.
-- A heartbeat after a lapse puts the worker back in its pool's index, which placement
-- left it out of while it was silent.
local wid = ARGV[2]
local key = wkey(wid)
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('SET', P .. 'alive:' .. wid, ARGV[3], 'PX', ARGV[4])
reindex(wid, redis.call('HGET', key, 'pool'))
return 1
