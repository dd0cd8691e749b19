-- Concurrency slots: a sorted set per (Key, Name) whose members are the
-- IDs of the requests holding a slot, scored by when their lease ends
-- (Unix ms). A lease that has ended is a slot given back: the slots of an
-- app server that died come back when their leases end.
--
-- KEYS[1]  the sorted set.
-- ARGV[1]  "acquire", "release" or "renew".
-- ARGV[2]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[3]  the slot's ID.
-- ARGV[4]  the lease in ms (acquire, renew).
-- ARGV[5]  the limit (acquire).
--
-- Reply: acquire {1, held} when a slot was taken (held counting it), or
-- {0, held} when all limit slots are held; release and renew {1} if the
-- slot was held, {0} if not (its lease had ended).
--
-- The key's expiry is kept at the latest lease end (PEXPIRE, extended
-- only), so that a set whose holders all died disappears.

local op = ARGV[1]
local key, id = KEYS[1], ARGV[3]
if op == 'release' then
  return {redis.call('ZREM', key, id)}
end
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local lease = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if op == 'renew' then
  if not redis.call('ZSCORE', key, id) then
    return {0}
  end
  redis.call('ZADD', key, 'XX', now + lease, id)
  redis.call('PEXPIRE', key, lease, 'GT')
  return {1}
end
-- acquire
local held = redis.call('ZCARD', key)
if held >= tonumber(ARGV[5]) then
  return {0, held}
end
redis.call('ZADD', key, now + lease, id)
if held == 0 then
  redis.call('PEXPIRE', key, lease)
else
  redis.call('PEXPIRE', key, lease, 'GT')
end
return {1, held + 1}
