-- Decides a request of a global limit on the region's own Redis; the
-- arithmetic of regions.Total and regions.Fits.
-- KEYS[1]: the current window's hash (one field per region)
-- KEYS[2]: the previous window's hash (sliding windows)
-- ARGV: self, cost, limit, now (ms), start (ms), w (ms), sliding (0/1),
--       share, ttl (ms), stale peers...
local self = ARGV[1]
local cost = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local start = tonumber(ARGV[5])
local w = tonumber(ARGV[6])
local sliding = ARGV[7] == "1"
local share = tonumber(ARGV[8])
local ttl = tonumber(ARGV[9])

local function sum(key)
  local kv = redis.call("HGETALL", key)
  local m = {}
  local s = 0
  for i = 1, #kv, 2 do
    local n = tonumber(kv[i + 1])
    m[kv[i]] = n
    s = s + n
  end
  for i = 10, #ARGV do
    local n = m[ARGV[i]] or 0
    if n < share then
      s = s + share - n
    end
  end
  return s, m[self] or 0
end

local total, own = sum(KEYS[1])
if sliding then
  local p = sum(KEYS[2])
  total = total + math.floor(p * (w - (now - start)) / w)
end
if cost > 0 and total + cost <= limit then
  own = redis.call("HINCRBY", KEYS[1], self, cost)
  redis.call("PEXPIRE", KEYS[1], ttl)
  return {1, total + cost, own}
end
return {0, total, own}
