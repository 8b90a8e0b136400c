-- ARGV: prefix, now_ms, ttl_ms, id, id, ... Returns the ids that were already reaped: they must register again.
-- heartbeat.lua for every worker whose keepalive reached this replica since its last batch, in one step.
local lost = {}
for i = 4, #ARGV do
  local wid = ARGV[i]
  local key = wkey(wid)
  if redis.call('EXISTS', key) == 0 then
    lost[#lost + 1] = wid
  else
    redis.call('SET', P .. 'alive:' .. wid, ARGV[2], 'PX', ARGV[3])
    reindex(wid, redis.call('HGET', key, 'pool'))
  end
end
return lost
