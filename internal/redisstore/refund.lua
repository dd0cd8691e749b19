-- Gives back the costs that sliding_window.lua counted for a request that
-- spans several hash slots and was then denied by a later slot.
--
-- KEYS[i]  the bucket of a counter charged by the request; a counter may
--          appear more than once, with the same states each time.
-- ARGV[1]  the instant the request was decided at (Unix ms).
-- ARGV[9i-7] .. ARGV[9i+1]
--          for charge i: the field, the window in ms, the cost, then the
--          counter rolled to the request's instant before the charge
--          (start, prev, curr), and the counter as read before rolling
--          (start, or -1 if there was none, prev, curr), all as returned by
--          sliding_window.lua.
--
-- If the counter is exactly as the request left it, what was there before
-- is put back (or the field deleted), so the request leaves no trace.
-- Otherwise, if the counter is still in the charged window, its current
-- count is decremented; if it has rolled exactly one window since, its
-- previous count is. Counts never go below 0, and a counter that has
-- expired or rolled further is left alone. Reply: the number of counters
-- changed.

local now = tonumber(ARGV[1])
local order, costs, args = {}, {}, {}
for i = 1, #KEYS do
  local j = 9 * i - 7
  local id = KEYS[i] .. '\0' .. ARGV[j]
  if costs[id] == nil then
    order[#order + 1] = id
    costs[id] = 0
    args[id] = {
      key = KEYS[i], field = ARGV[j], w = tonumber(ARGV[j + 1]),
      s = tonumber(ARGV[j + 3]), p = tonumber(ARGV[j + 4]), c = tonumber(ARGV[j + 5]),
      s0 = tonumber(ARGV[j + 6]), p0 = tonumber(ARGV[j + 7]), c0 = tonumber(ARGV[j + 8]),
    }
  end
  costs[id] = costs[id] + tonumber(ARGV[j + 2])
end

local function put(a, s, p, c)
  redis.call('HSET', a.key, a.field, struct.pack('<dddd', s, p, c, a.w))
end

local changed = 0
for _, id in ipairs(order) do
  local a, cost = args[id], costs[id]
  local v = redis.call('HGET', a.key, a.field)
  local s, p, c
  if v and #v == 32 then
    s, p, c = struct.unpack('<dddd', v)
  end
  if s == nil or cost <= 0 then
    -- Gone, or nothing to give back.
  elseif s == a.s and p == a.p and c == a.c + cost then
    if a.s0 < 0 or a.s0 + 2 * a.w <= now then
      redis.call('HDEL', a.key, a.field)
    else
      put(a, a.s0, a.p0, a.c0)
    end
    changed = changed + 1
  elseif s == a.s then
    put(a, s, p, math.max(0, c - cost))
    changed = changed + 1
  elseif s == a.s + a.w then
    put(a, s, math.max(0, p - cost), c)
    changed = changed + 1
  end
end
return changed
