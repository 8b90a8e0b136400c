-- ARGV: prefix. Counts the registered workers by pool, GPU model and status, where a worker whose keepalive
-- has lapsed counts as 'silent'. Returns {pool, gpu, status, count} for each combination found; a worker
-- whose record is gone (removed meanwhile) is not counted.
local counts, order = {}, {}
for _, wid in ipairs(redis.call('SMEMBERS', P .. 'workers')) do
  local w = redis.call('HMGET', wkey(wid), 'pool', 'gpu', 'status')
  if w[1] and w[3] then
    local status = w[3]
    if redis.call('EXISTS', P .. 'alive:' .. wid) == 0 then status = 'silent' end
    local gpu = w[2] or ''
    local key = w[1] .. '\0' .. gpu .. '\0' .. status
    if counts[key] == nil then
      counts[key] = {w[1], gpu, status, 0}
      order[#order + 1] = key
    end
    counts[key][4] = counts[key][4] + 1
  end
end
local out = {}
for _, key in ipairs(order) do out[#out + 1] = counts[key] end
return out
