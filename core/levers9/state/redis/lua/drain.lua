-- ARGV: prefix, id, now_ms, idle_ms.
-- Stops placing on a worker only if it has been idle for idle_ms, in the same step that
-- checks it, so work placed a moment earlier is never stranded on a machine being released.
local wid, now, idle = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local key = wkey(wid)
local w = redis.call('HMGET', key, 'status', 'running', 'idle_since', 'pool', 'queued')
if w[1] ~= 'running' or tonumber(w[2]) ~= 0 or tonumber(w[5] or 0) ~= 0 or now - tonumber(w[3]) < idle then
  return 0
end
redis.call('HSET', key, 'status', 'draining')
reindex(wid, w[4])
return 1
