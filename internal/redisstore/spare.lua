-- Spare capacity of a fleet of app servers, in two sorted sets of the
-- servers' names: KEYS[1] scored by each server's spare in permille, and
-- KEYS[2] by the expiry of its entry (Unix ms). Each server publishes its
-- own spare with a short expiry and reads the fleet's in the same call: the
-- least spare of the servers whose entries have not expired. A call costs
-- O(log servers): it drops at most 64 expired entries (the oldest), reads
-- the least spare, and counts the servers, whatever their number (a hash of
-- every server's entry, read whole at each call, cost a thousand servers
-- half a millisecond of Redis per call, 4,000 calls a second).
--
-- KEYS[1]  the servers by spare.
-- KEYS[2]  the servers by expiry.
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  the server's name.
-- ARGV[3]  its spare, in permille (0 to 1000).
-- ARGV[4]  how long the entry lives, in ms.
--
-- Reply: {least spare in permille, number of live servers}. An entry that
-- expired and was not dropped yet (more than 64 at once) may count until a
-- later call drops it: the least spare is then at most the true one, which
-- errs on the side of less capacity.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local ttl = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 64)
if #gone > 0 then
  redis.call('ZREM', KEYS[2], unpack(gone))
  redis.call('ZREM', KEYS[1], unpack(gone))
end
local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local n = redis.call('ZCARD', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
redis.call('PEXPIRE', KEYS[2], ttl * 2)
return {tonumber(low[2]) or 1000, n}
