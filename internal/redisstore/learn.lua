-- The learned fraction of one budget of an upstream (package
-- internal/learn), shared by the fleet: a hash of four integers, lv and tg
-- (the level just after the last cut and the target of the recovery, in
-- parts per million), at (the instant of the last cut, Unix ms) and n (the
-- cuts so far). Every process computes the fraction from it with the
-- cubic of internal/learn; this script only commits a cut, atomically,
-- and is the twin of learn.Commit: a cut applies when it was computed from
-- the state stored (its base has the stored at) and its refused request
-- was admitted at least the guard after the stored cut.
--
-- KEYS[1]  the state.
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  "read" or "cut".
-- ARGV[3]  (cut) the at of the state the cut was computed from.
-- ARGV[4]  (cut) how long before now the refused request was admitted, ms.
-- ARGV[5]  (cut) the guard, ms.
-- ARGV[6]  (cut) the new level, ppm.
-- ARGV[7]  (cut) the new target, ppm.
-- ARGV[8]  (cut) how long the state lives after a cut, ms.
--
-- Reply: {lv, tg, at, n, now, applied (1 or 0)}.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local v = redis.call('HMGET', KEYS[1], 'lv', 'tg', 'at', 'n')
local lv, tg, at, n = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0
if ARGV[2] ~= 'cut' then
  return {lv, tg, at, n, now, 0}
end
if at ~= tonumber(ARGV[3]) then
  return {lv, tg, at, n, now, 0}
end
local admitted = now - tonumber(ARGV[4])
if at ~= 0 and admitted < at + tonumber(ARGV[5]) then
  return {lv, tg, at, n, now, 0}
end
lv, tg, at, n = tonumber(ARGV[6]), tonumber(ARGV[7]), now, n + 1
redis.call('HSET', KEYS[1], 'lv', lv, 'tg', tg, 'at', at, 'n', n)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[8]))
return {lv, tg, at, n, now, 1}
