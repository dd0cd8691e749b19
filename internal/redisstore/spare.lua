-- Spare capacity of a fleet of app servers: a HASH whose fields are the
-- servers' names and whose values are "<spare in permille>:<expiry in
-- Unix ms>". Each server publishes its own spare with a short expiry and
-- reads the fleet's in the same call: the minimum over the servers whose
-- entries have not expired (entries that have are deleted).
--
-- KEYS[1]  the hash.
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  the server's name.
-- ARGV[3]  its spare, in permille (0 to 1000).
-- ARGV[4]  how long the entry lives, in ms.
--
-- Reply: {minimum spare in permille, number of live servers}.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3] .. ':' .. (now + ttl))
local all = redis.call('HGETALL', KEYS[1])
local low, n = 1000, 0
for i = 1, #all, 2 do
  local v = all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local spare, exp = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  if exp == nil or spare == nil or exp <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    n = n + 1
    if spare < low then low = spare end
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {low, n}
