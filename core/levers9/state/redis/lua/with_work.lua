-- ARGV: prefix. Returns the workers whose queue holds requests placed on them that they have not taken.
-- The safety net behind the replicas' wake-ups, for every worker in one step: no id travels to Redis, and at
-- rest nothing travels back.
local out = {}
for _, wid in ipairs(redis.call('SMEMBERS', P .. 'workers')) do
  if redis.call('LLEN', P .. 'wq:' .. wid) > 0 then out[#out + 1] = wid end
end
return out
