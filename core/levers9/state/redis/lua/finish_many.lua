-- ARGV: prefix, now_ms, only_worker, wake_per_freed, request id...
-- finish.lua for many requests in one step (a worker reports results in batches), in order: the room each
-- frees goes to its worker's queue before the next request is looked at.
-- only_worker: when not '', a request placed on another worker, or on none (still queued, or queued
-- again), is left alone: a worker reports only on what was placed on it, and a late report from a worker
-- presumed dead must not free the worker that now runs the request. It comes back as '!', its worker, ''.
-- wake_per_freed: for each place freed in a pool, this many of its waiting requests become due
-- now (as wake.lua does), so the next placement pass sees them without another round trip.
-- Returns, per request in order, previous state, worker and pool ('' for each when unknown; '!' and the
-- worker it is placed on, '' for none, when left alone for only_worker), then how
-- many waiting requests it made due (the placement loop has nothing new to look at when none).
local now = tonumber(ARGV[2])
local only = ARGV[3]
local per_freed = tonumber(ARGV[4])
local out = {}
local freed = {}
for i = 5, #ARGV do
  local rid = ARGV[i]
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker', 'pool', 'groups', 'long', 'fn', 'start')
  local worker, pool = r[5] or '', r[6] or ''
  if not r[1] then
    out[#out + 1], out[#out + 2], out[#out + 3] = '', '', ''
  elseif only ~= '' and worker ~= only then
    out[#out + 1], out[#out + 2], out[#out + 3] = '!', worker, ''
  else
    if release(rid, r[4], worker, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), r[8], now) then
      learn(r[9], r[10], now)
      if pool ~= '' then freed[pool] = (freed[pool] or 0) + 1 end
    end
    redis.call('ZREM', P .. 'backlog', rid)
    unmet_rem(rid, r[7])
    redis.call('DEL', rkey)
    out[#out + 1], out[#out + 2], out[#out + 3] = r[4], worker, pool
  end
end
local woken = 0
if per_freed > 0 then
  for pool, count in pairs(freed) do
    for _, rid in ipairs(redis.call('ZRANGE', P .. 'unmet:' .. pool, 0, count * per_freed - 1)) do
      redis.call('ZADD', P .. 'backlog', 'XX', 'CH', now, rid)
      woken = woken + 1
    end
  end
end
out[#out + 1] = woken
return out
