-- ARGV: prefix, pool, now_ms, count.
-- Capacity appeared in a pool: the oldest requests that were waiting for it are due now
-- instead of at their next recheck.
local pool, now, count = ARGV[2], ARGV[3], tonumber(ARGV[4])
local woken = 0
for _, rid in ipairs(redis.call('ZRANGE', P .. 'unmet:' .. pool, 0, count - 1)) do
  woken = woken + redis.call('ZADD', P .. 'backlog', 'XX', 'CH', now, rid)
end
return woken
