-- ARGV: prefix, worker id, max.
-- The worker takes up to `max` of the requests placed on it, which then count as running.
local wid, max = ARGV[2], tonumber(ARGV[3])
local out = {}
for _ = 1, max do
  local rid = redis.call('LPOP', P .. 'wq:' .. wid)
  if not rid then break end
  local rkey = P .. 'r:' .. rid
  if redis.call('HGET', rkey, 'worker') == wid then
    redis.call('HSET', rkey, 'state', 'running')
    out[#out + 1] = rid
  end
end
return out
