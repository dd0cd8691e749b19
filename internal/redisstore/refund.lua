-- Gives back the costs that sliding_window.lua counted for a request that
-- spans several hash slots and was then denied by a later slot.
--
-- KEYS[i]  a counter charged by the request; a key may appear more than
--          once, with the same states each time.
-- ARGV[1]  the instant the request was decided at (Unix ms).
-- ARGV[8i-6] .. ARGV[8i+1]
--          for charge i: window in ms, cost, then the counter rolled to
--          the request's instant before the charge (start, prev, curr), and
--          the fields read before rolling (start, or -1 if the key did not
--          exist, prev, curr), all as returned by sliding_window.lua.
--
-- If the counter is exactly as the request left it, what was there before
-- is put back (or the key deleted), so the request leaves no trace.
-- Otherwise, if the counter is still in the charged window, its current
-- count is decremented; if it has rolled exactly one window since, its
-- previous count is. Counts never go below 0, and a counter that has
-- expired or rolled further is left alone. Reply: the number of counters
-- changed.

local now = tonumber(ARGV[1])
local order, costs, args = {}, {}, {}
for i = 1, #KEYS do
  local j = 8 * i - 6
  local key = KEYS[i]
  if costs[key] == nil then
    order[#order + 1] = key
    costs[key] = 0
    args[key] = {
      w = tonumber(ARGV[j]),
      s = tonumber(ARGV[j + 2]), p = tonumber(ARGV[j + 3]), c = tonumber(ARGV[j + 4]),
      s0 = tonumber(ARGV[j + 5]), p0 = tonumber(ARGV[j + 6]), c0 = tonumber(ARGV[j + 7]),
    }
  end
  costs[key] = costs[key] + tonumber(ARGV[j + 1])
end

local changed = 0
for _, key in ipairs(order) do
  local a, cost = args[key], costs[key]
  local h = redis.call('HMGET', key, 's', 'p', 'c')
  local s, p, c = tonumber(h[1]), tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if s == nil or cost <= 0 then
    -- Gone, or nothing to give back.
  elseif s == a.s and p == a.p and c == a.c + cost then
    local ttl = a.s0 + 2 * a.w - now
    if a.s0 < 0 or ttl <= 0 then
      redis.call('DEL', key)
    else
      redis.call('HSET', key, 's', a.s0, 'p', a.p0, 'c', a.c0)
      redis.call('PEXPIRE', key, ttl)
    end
    changed = changed + 1
  elseif s == a.s then
    redis.call('HSET', key, 'c', math.max(0, c - cost))
    changed = changed + 1
  elseif s == a.s + a.w then
    redis.call('HSET', key, 'p', math.max(0, p - cost))
    changed = changed + 1
  end
end
return changed
