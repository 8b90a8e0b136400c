-- ARGV: prefix, then (request id, next_plan_ms, tried) for each request noted.
-- The planner's notes on requests, written only while each request is still known;
-- returns how many were.
local written = 0
for i = 2, #ARGV, 3 do
  local rkey = P .. 'r:' .. ARGV[i]
  if redis.call('EXISTS', rkey) == 1 then
    redis.call('HSET', rkey, 'next_plan', ARGV[i + 1], 'tried', ARGV[i + 2])
    written = written + 1
  end
end
return written
