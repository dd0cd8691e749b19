-- Takes back the costs of an admitted request whose response its rule does
-- not count (window.Refund, its Go twin): the charge was made before the
-- handler ran, so that concurrent requests could not exceed the limit, and
-- is given back once the response's status is known.
--
-- KEYS[i]  the bucket of charge i.
-- ARGV[1]  the instant the request was decided at (Unix ms).
-- Then, for each charge in turn, four arguments: its field, its
-- algorithm's code (as in decide.lua), its cost, and
--   "0" sliding window  the window in ms
--   "1", "4" fixed      the start of the window that holds ARGV[1]
--   "3" token bucket    the window in ms (a token is window / tick drops,
--                       in the tick the level is stored in)
--   "2" sliding log     the window in ms
--
-- A sliding window gives the cost back from the current count if the
-- instant lies in its current window, from the previous count if it lies
-- in the window before; a fixed window from its count if it is still in
-- the window charged; a token bucket from its level, whatever the time; a
-- sliding log from the entry of the instant, if it still holds one (the
-- entry goes when nothing is left of it).
-- Counts and levels never go below 0, a fixed window, token bucket or log
-- left empty is deleted, and a counter that is absent, of another form, or
-- has moved on is left alone. Expiries are left as they are: a counter
-- only shrinks (a log's expiry, the instant its newest entry leaves, is
-- moved to its new newest entry). Reply: the number of counters changed.

local at = tonumber(ARGV[1])
local unpack, pack, byte, sub = struct.unpack, struct.pack, string.byte, string.sub
local max, min = math.max, math.min

local changed = 0
local a = 2
for i = 1, #KEYS do
  local key, field, code = KEYS[i], ARGV[a], ARGV[a + 1]
  local cost, x = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  a = a + 4
  local v = redis.call('HGET', key, field)
  if v and cost > 0 then
    if code == '0' then
      if #v == 32 then
        local s, p, c, w = unpack('<dddd', v)
        if w == x then
          if at >= s and at < s + w and c > 0 then
            redis.call('HSET', key, field, pack('<dddd', s, p, max(0, c - cost), w))
            changed = changed + 1
          elseif at >= s - w and at < s and p > 0 then
            redis.call('HSET', key, field, pack('<dddd', s, max(0, p - cost), c, w))
            changed = changed + 1
          end
        end
      end
    elseif code == '1' or code == '4' then
      if #v == 21 and byte(v, 1) == 70 then
        local _, e, s, c = unpack('<Bi6i6d', v)
        if s == x and c > 0 then
          if c > cost then
            redis.call('HSET', key, field, pack('<Bi6i6d', 70, e, s, c - cost))
          else
            redis.call('HDEL', key, field)
          end
          changed = changed + 1
        end
      end
    elseif code == '3' then
      if #v == 27 and byte(v, 1) == 84 then
        local _, e, s, r, level = unpack('<Bi6i6i6d', v)
        if e > at and level > 0 then
          level = max(0, level - cost * max(math.floor(x / r), 1))
          if level == 0 then
            redis.call('HDEL', key, field)
          else
            redis.call('HSET', key, field, pack('<Bi6i6i6d', 84, e, s, r, level))
          end
          changed = changed + 1
        end
      end
    elseif code == '2' then
      local len = #v
      if len >= 21 and (len - 11) % 10 == 0 and byte(v, 1) == 76 then
        -- The entry of the instant, searched from the newest.
        local p = len - 9
        while p >= 12 and unpack('<i6', v, p) > at do
          p = p - 10
        end
        if p >= 12 and unpack('<i6', v, p) == at then
          local _, m = unpack('<i6I4', v, p)
          local _, _, count = unpack('<Bi6I4', v)
          local n = min(m, cost)
          local body
          if m > n then
            body = sub(v, 12, p - 1) .. pack('<i6I4', at, m - n) .. sub(v, p + 10)
          else
            body = sub(v, 12, p - 1) .. sub(v, p + 10)
          end
          if #body == 0 then
            redis.call('HDEL', key, field)
          else
            local newest = unpack('<i6', body, #body - 9)
            redis.call('HSET', key, field, pack('<Bi6I4', 76, newest + x, max(0, count - n)) .. body)
          end
          changed = changed + 1
        end
      end
    else
      return redis.error_reply('ERR sluice: takeback: unknown algorithm code ' .. tostring(code))
    end
  end
end
return changed
