-- ARGV: prefix, now_ms, request id...
-- finish.lua for many requests in one step (a worker reports results in batches).
-- Returns, per request in order, previous state, worker and pool ('' for each when unknown).
local now = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local rid = ARGV[i]
  local rkey = P .. 'r:' .. rid
  local r = redis.call('HMGET', rkey, 'cpu', 'mem', 'held', 'state', 'worker', 'pool', 'groups')
  if not r[1] then
    out[#out + 1], out[#out + 2], out[#out + 3] = '', '', ''
  else
    local worker, pool = r[5] or '', r[6] or ''
    if (r[4] == 'placed' or r[4] == 'running') and worker ~= '' then
      give_back(worker, pool, tonumber(r[1]), tonumber(r[2]), tonumber(r[3]), now)
      redis.call('SREM', P .. 'wr:' .. worker, rid)
      redis.call('LREM', P .. 'wq:' .. worker, 0, rid)
    end
    redis.call('ZREM', P .. 'backlog', rid)
    unmet_rem(rid, r[7])
    redis.call('DEL', rkey)
    out[#out + 1], out[#out + 2], out[#out + 3] = r[4], worker, pool
  end
end
return out
