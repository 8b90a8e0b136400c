-- ARGV: prefix. Returns the workers whose keepalive has lapsed (the reaper's list), in one step.
local out = {}
for _, wid in ipairs(redis.call('SMEMBERS', P .. 'workers')) do
  if redis.call('EXISTS', P .. 'alive:' .. wid) == 0 then out[#out + 1] = wid end
end
return out
