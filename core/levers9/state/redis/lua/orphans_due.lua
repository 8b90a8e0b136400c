-- ARGV: prefix, now_ms, limit.
-- The requests kept for a worker that did not register again in time (see orphan.lua) go back on the
-- backlog, due now, their attempt counted. Returns their ids (the caller requeues them in SQL too).
local now, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for _, rid in ipairs(redis.call('ZRANGEBYSCORE', P .. 'orphans', '-inf', now, 'LIMIT', 0, limit)) do
  redis.call('ZREM', P .. 'orphans', rid)
  local rkey = P .. 'r:' .. rid
  if redis.call('HGET', rkey, 'state') == 'orphan' then
    redis.call('HSET', rkey, 'state', 'queued', 'worker', '', 'pool', '', 'held', 0, 'taken', 0)
    redis.call('HINCRBY', rkey, 'attempts', 1)
    redis.call('ZADD', P .. 'backlog', now, rid)
    out[#out + 1] = rid
  end
end
return out
