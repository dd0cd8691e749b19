-- Probes what sluice's scripts need of the server (package redisprobe).
-- KEYS[1]: a key of sluice's that holds nothing; it is only read.
-- Reply: what the server lacks, one item a line; "" when nothing.
local missing = {}
local function need(ok, what)
  if not ok then missing[#missing + 1] = what end
end
local function answered(r)
  return type(r) ~= 'table' or r.err == nil
end
need(pcall(function()
  local f = '<Bi6I4i8dc2'
  local s = struct.pack(f, 84, -5, 7, -1099511627776, 0.5, 'ab')
  local a, b, c, d, e, g = struct.unpack(f, s)
  assert(#s == 29 and a == 84 and b == -5 and c == 7 and d == -1099511627776 and e == 0.5 and g == 'ab')
  local h1, h2 = struct.unpack('<HH', struct.pack('<HH', 1, 65535))
  assert(h1 == 1 and h2 == 65535)
end), 'the struct library of Redis Lua (struct.pack and struct.unpack); miniredis has none, ' ..
  'and github.com/sluicehq/sluice/middleware/sluicetest/miniredis adds it')
local t = redis.pcall('TIME')
need(type(t) == 'table' and t.err == nil and tonumber(t[1]) ~= nil and tonumber(t[2]) ~= nil, 'TIME in scripts')
need(answered(redis.pcall('HRANDFIELD', KEYS[1], 8, 'WITHVALUES')), 'HRANDFIELD with WITHVALUES (Redis 6.2)')
need(answered(redis.pcall('PEXPIRE', KEYS[1], 60000, 'GT')) and answered(redis.pcall('PEXPIRE', KEYS[1], 60000, 'NX')),
  'PEXPIRE with GT and NX (Redis 7.0)')
need(answered(redis.pcall('ZADD', KEYS[1], 'XX', 'GT', 1, 'm')), 'ZADD with GT (Redis 6.2)')
need(type(redis.error_reply) == 'function', 'redis.error_reply')
return table.concat(missing, '\n')
