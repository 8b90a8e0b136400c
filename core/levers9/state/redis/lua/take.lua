-- ARGV: prefix, worker id, max.
-- The worker takes up to `max` of the requests placed on it: those holding room count as running; those
-- waiting in its own queue stay waiting (marked taken: the worker holds them and starts them as its room
-- frees). Returns request id and '1' (waiting) or '0' per request taken.
local wid, max = ARGV[2], tonumber(ARGV[3])
local out = {}
for _ = 1, max do
  local rid = redis.call('LPOP', P .. 'wq:' .. wid)
  if not rid then break end
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'worker', 'state')
  if r[1] == wid then
    if r[2] == 'waiting' then
      redis.call('HSET', rkey, 'taken', 1)
    else
      redis.call('HSET', rkey, 'state', 'running')
    end
    out[#out + 1] = rid
    out[#out + 1] = r[2] == 'waiting' and '1' or '0'
  end
end
return out
