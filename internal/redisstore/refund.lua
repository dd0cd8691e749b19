-- Gives back the costs that decide.lua counted for a request that spans
-- several hash slots and was then denied by a later slot.
--
-- KEYS[i]  the bucket of a counter charged by the request; a counter may
--          appear more than once, with the same states each time.
-- ARGV[1]  the instant the request was decided at (Unix ms).
-- Then, for each charge in turn, its field, its algorithm's code (as in
-- decide.lua), its cost, and what decide.lua returned of it:
--   "0" sliding window  window, then the counter rolled to the request's
--                       instant before the charge (start, prev, curr), and
--                       as read before rolling (start, or -1 if there was
--                       none, prev, curr)
--   "1", "4" fixed      the start of the window charged
--   "3", "5" token and  window, tick, the rolled counter (start, tick,
--       leaky bucket    level) and as read (start or -1, tick, level,
--                       expiry)
--   "2" sliding log     window, and the instant the request was decided at
--
-- If the counter is exactly as the request left it, what was there before
-- is put back (or the field deleted), so the request leaves no trace; for
-- a sliding log, the request's entry goes, but entries that its decision
-- dropped for having left the window are not brought back. Otherwise:
--   sliding window  if the counter is still in the charged window, its
--                   current count is decremented; if it has rolled exactly
--                   one window since, its previous count is;
--   fixed window    if the counter is still in the charged window, its
--                   count is decremented;
--   token bucket    cost tokens are taken off the level (for a leaky
--   and leaky       bucket, the queue, as window.GiveBack does);
--   bucket
--   sliding log     the entry of the request's instant is decremented.
-- Counts and levels never go below 0, a fixed window, token bucket or
-- sliding log left empty is deleted, and a counter that has expired or
-- rolled further is left alone. Reply: the number of counters changed.

local now = tonumber(ARGV[1])
local unpack, pack, byte, sub = struct.unpack, struct.pack, string.byte, string.sub
local floor, min, max = math.floor, math.min, math.max
local width = {['0'] = 10, ['1'] = 4, ['4'] = 4, ['3'] = 12, ['5'] = 12, ['2'] = 5}

local order, costs, args = {}, {}, {}
local a = 2
for i = 1, #KEYS do
  local field, code = ARGV[a], ARGV[a + 1]
  local wd = width[code]
  if wd == nil then
    return redis.error_reply('ERR sluice: unknown algorithm code ' .. tostring(code))
  end
  local id = KEYS[i] .. '\0' .. field
  if costs[id] == nil then
    order[#order + 1] = id
    costs[id] = 0
    local x = {key = KEYS[i], field = field, code = code}
    for k = 3, wd - 1 do
      x[k - 2] = tonumber(ARGV[a + k])
    end
    args[id] = x
  end
  costs[id] = costs[id] + tonumber(ARGV[a + 2])
  a = a + wd
end

local function put(x, v)
  redis.call('HSET', x.key, x.field, v)
end

local function del(x)
  redis.call('HDEL', x.key, x.field)
end

-- Each returns whether it changed the counter.
local refund = {}

-- Sliding window: 1 window, 2-4 rolled start, prev, curr, 5-7 stored.
refund['0'] = function(x, v, cost)
  if not v or #v ~= 32 then
    return false
  end
  local w = x[1]
  local s, p, c = unpack('<dddd', v)
  if s == x[2] and p == x[3] and c == x[4] + cost then
    if x[5] < 0 or x[5] + 2 * w <= now then
      del(x)
    else
      put(x, pack('<dddd', x[5], x[6], x[7], w))
    end
  elseif s == x[2] then
    put(x, pack('<dddd', s, p, max(0, c - cost), w))
  elseif s == x[2] + w then
    put(x, pack('<dddd', s, max(0, p - cost), c, w))
  else
    return false
  end
  return true
end

-- Fixed window: 1 the start of the charged window. Put back as it was
-- means the count less the cost, since a count of another window than the
-- charged one was as good as none.
local function fixed(x, v, cost)
  if not v or #v ~= 21 or byte(v, 1) ~= 70 then
    return false
  end
  local _, e, s, c = unpack('<Bi6i6d', v)
  if s ~= x[1] then
    return false
  end
  if c > cost then
    put(x, pack('<Bi6i6d', 70, e, s, c - cost))
  else
    del(x)
  end
  return true
end
refund['1'] = fixed
refund['4'] = fixed

-- Token bucket: 1 window, 2 tick, 3-5 rolled start, tick, level, 6-9
-- stored start, tick, level and expiry.
refund['3'] = function(x, v, cost)
  if not v or #v ~= 27 or byte(v, 1) ~= 84 then
    return false
  end
  local _, exp, s, r, level = unpack('<Bi6i6i6d', v)
  local w = x[1] / x[2]
  if s == x[3] and r == x[4] and level == x[5] + cost * w then
    if x[6] < 0 or x[9] <= now then
      del(x)
    else
      put(x, pack('<Bi6i6i6d', 84, x[9], x[6], x[7], x[8]))
    end
    return true
  end
  if r ~= x[2] then
    -- Counted in other ticks since.
    w = max(floor(x[1] / r), 1)
  end
  level = level - cost * w
  if level <= 0 then
    del(x)
  else
    put(x, pack('<Bi6i6i6d', 84, exp, s, r, level))
  end
  return true
end
refund['5'] = refund['3']

-- Sliding log: 1 window, 2 the instant of the request's entry.
refund['2'] = function(x, v, cost)
  if not v then
    return false
  end
  local len = #v
  if len < 21 or (len - 11) % 10 ~= 0 or byte(v, 1) ~= 76 then
    return false
  end
  local at = x[2]
  -- The entry is the newest unless later requests were admitted.
  local p = len - 9
  while p >= 12 do
    local t = unpack('<i6', v, p)
    if t == at then
      break
    elseif t < at then
      return false
    end
    p = p - 10
  end
  if p < 12 then
    return false
  end
  local _, m = unpack('<i6I4', v, p)
  local _, _, count = unpack('<Bi6I4', v)
  count = max(0, count - min(m, cost))
  local body
  if m > cost then
    body = sub(v, 12, p - 1) .. pack('<i6I4', at, m - cost) .. sub(v, p + 10)
  else
    body = sub(v, 12, p - 1) .. sub(v, p + 10)
  end
  if #body == 0 then
    del(x)
  else
    local newest = unpack('<i6', body, #body - 9)
    put(x, pack('<Bi6I4', 76, newest + x[1], count) .. body)
  end
  return true
end

local changed = 0
for _, id in ipairs(order) do
  local x, cost = args[id], costs[id]
  if cost > 0 and refund[x.code](x, redis.call('HGET', x.key, x.field), cost) then
    changed = changed + 1
  end
end
return changed
