-- ARGV: prefix, request id, next_plan_ms, tried.
-- The planner's notes on a request, written only while the request is still known.
local rkey = P .. 'r:' .. ARGV[2]
if redis.call('EXISTS', rkey) == 0 then return 0 end
redis.call('HSET', rkey, 'next_plan', ARGV[3], 'tried', ARGV[4])
return 1
