-- Top-client summaries of a fleet, one rule's: a HASH of the servers'
-- payloads and a sorted set of the servers scored by when each last
-- published, both in one hash slot. A server publishes with ARGV[1] =
-- 'put'; a reader collects the payloads of the servers that published
-- within the TTL with 'get'. Either drops the servers that did not.
--
-- KEYS[1]  the sorted set of servers.
-- KEYS[2]  the hash of payloads.
-- ARGV[1]  'put' or 'get'.
-- ARGV[2]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[3]  the TTL, in ms.
-- ARGV[4]  (put) the server's name.
-- ARGV[5]  (put) its payload.
--
-- Reply: put: now. get: {now, name1, published1, payload1, name2, ...}.

local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local ttl = tonumber(ARGV[3])
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
if #stale > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
  redis.call('HDEL', KEYS[2], unpack(stale))
end
if ARGV[1] == 'put' then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  return now
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local out = {now}
if #live == 0 then
  return out
end
local names = {}
for i = 1, #live, 2 do
  names[#names + 1] = live[i]
end
local payloads = redis.call('HMGET', KEYS[2], unpack(names))
for i = 1, #names do
  if payloads[i] then
    out[#out + 1] = names[i]
    out[#out + 1] = tonumber(live[2 * i])
    out[#out + 1] = payloads[i]
  end
end
return out
