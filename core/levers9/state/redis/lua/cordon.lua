-- ARGV: prefix, id.
-- Stops placing on a worker whatever it runs (it is shutting down and finishes what it has).
-- Returns 1 when the worker is known, 0 when it is not.
local wid = ARGV[2]
local key = wkey(wid)
local pool = redis.call('HGET', key, 'pool')
if not pool then return 0 end
redis.call('HSET', key, 'status', 'draining')
reindex(wid, pool)
return 1
