-- Merges a peer region's count of one window into this region's copy:
-- the largest value per region wins (regions.Merge), so repeats and
-- reordering are harmless.
-- KEYS[1]: the window's hash; ARGV: region, count, ttl (ms)
local n = tonumber(ARGV[2])
local cur = tonumber(redis.call("HGET", KEYS[1], ARGV[1]) or "0")
if n > cur then
  redis.call("HSET", KEYS[1], ARGV[1], n)
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[3]))
  return n
end
return cur
