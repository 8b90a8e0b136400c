-- ARGV: prefix, field count N, N field names, then worker ids. Returns one JSON text: per id, the HMGET of
-- those fields of its record (false where a field or the record is missing). One reply for a whole fleet:
-- a client parses one string instead of N values per worker.
local n = tonumber(ARGV[2])
local fields = {}
for i = 1, n do fields[i] = ARGV[2 + i] end
local rows = {}
for i = 3 + n, #ARGV do
  rows[#rows + 1] = redis.call('HMGET', wkey(ARGV[i]), unpack(fields))
end
return cjson.encode(rows)
