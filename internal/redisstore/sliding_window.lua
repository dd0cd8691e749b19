-- Sliding-window counter: the Redis side of window.Take (internal/window),
-- the same integer arithmetic line for line.
--
-- KEYS[i]  the bucket of charge i: a HASH holding the counters of many
--          clients, one field per counter.
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  "1" to charge, "0" for a dry run that decides but never writes.
-- ARGV[5i-2] .. ARGV[5i+2]
--          field, limit, window in ms, tick in ms and cost of charge i.
--
-- A counter is the field's value "start prev curr window": the start of
-- its current window (Unix ms), the counts of the previous and current
-- windows, and the window in ms (so that any request can tell an expired
-- field of another counter and drop it). A bucket expires two windows
-- after its latest write, like each of its counters; a field that is past
-- that is treated as absent, and up to two such fields are dropped each
-- time a new field is added to the bucket.
--
-- Every charge is decided at one instant, against the counters as they were
-- before the request; the costs are added only if every charge fits. Only
-- the counters of admitted charges with a cost are written: a denied
-- request or a read (cost 0) changes nothing. Two charges may name the same
-- counter; each is then decided on its own and both costs are counted.
--
-- All numbers are integers below 2^53 (window.Limit.Tick chooses the tick
-- so that 3 * (limit + 1) * ticks <= 2^53, counts are capped at limit + 1,
-- and the caller caps a cost at limit + 1), so the double arithmetic of
-- Lua is exact; divisions are floored explicitly.
--
-- Reply: {allowed_all, now, then per charge i: allowed, remaining, reset_ms,
-- retry_ms, next_ms, start, prev, curr, stored_start, stored_prev,
-- stored_curr}, where start, prev and curr are the counter rolled to now
-- before this request's cost was added, and the stored_ values are the
-- counter as it was read (stored_start is -1 if there was none). retry_ms
-- is -1 when the cost exceeds the limit.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local charge = ARGV[2] == '1'
local n = #KEYS

local function parse(v)
  if not v then
    return nil
  end
  local s, p, c, w = string.match(v, '^(%d+) (%d+) (%d+) (%d+)$')
  if not s then
    return nil
  end
  return tonumber(s), tonumber(p), tonumber(c), tonumber(w)
end

local L, W, R, COST, S, P, C, AT, OK, RAW, NEW = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local all = true
for i = 1, n do
  local a = 5 * i - 2
  local limit, w, r, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local s, p, c = parse(redis.call('HGET', KEYS[i], ARGV[a]))
  if s == nil then
    RAW[i] = {-1, 0, 0}
    s, p, c = 0, 0, 0
    NEW[i] = true
  else
    RAW[i] = {s, p, c}
  end
  -- Roll (window.Roll).
  local at = now
  if p == 0 and c == 0 then
    s = now
  elseif now < s then
    -- The clock went backwards: decide at the start of the stored window.
    at = s
  else
    local k = math.floor((now - s) / w)
    if k == 1 then
      s, p, c = s + w, c, 0
    elseif k >= 2 then
      p, c = 0, 0
    end
    if p == 0 and c == 0 then
      s = now
    end
  end
  -- Fits (window.Fits), in ticks, with the counts capped at limit + 1.
  local ticks = w / r
  local e = math.floor((at - s) / r)
  local pp, cc = math.min(p, limit + 1), math.min(c, limit + 1)
  local ok = cost <= limit and pp * (ticks - 1 - e) + (cc + cost) * ticks <= limit * ticks
  L[i], W[i], R[i], COST[i] = limit, w, r, cost
  S[i], P[i], C[i], AT[i], OK[i] = s, p, c, at, ok
  all = all and ok
end

if charge and all then
  -- One write per counter, with every cost charged to it.
  local first, total = {}, {}
  for i = 1, n do
    if COST[i] > 0 then
      local id = KEYS[i] .. '\0' .. ARGV[5 * i - 2]
      local j = first[id]
      if j == nil then
        first[id] = i
        total[i] = COST[i]
      else
        total[j] = total[j] + COST[i]
      end
    end
  end
  local expire, added = {}, {}
  for i = 1, n do
    if total[i] then
      local key, field = KEYS[i], ARGV[5 * i - 2]
      if NEW[i] and not added[key] then
        -- Drop up to two expired counters of other clients.
        added[key] = true
        local sample = redis.call('HRANDFIELD', key, 2, 'WITHVALUES')
        for j = 1, #sample, 2 do
          local s, _, _, w = parse(sample[j + 1])
          if s ~= nil and s + 2 * w <= now and sample[j] ~= field then
            redis.call('HDEL', key, sample[j])
          end
        end
      end
      redis.call('HSET', key, field, string.format('%d %d %d %d', S[i], P[i], C[i] + total[i], W[i]))
      -- window.Expiry: the rest of this window plus the next one.
      expire[key] = math.max(expire[key] or 1, S[i] + 2 * W[i] - now)
    end
  end
  for key, ttl in pairs(expire) do
    if redis.call('PTTL', key) < ttl then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end

-- Describe (window.Describe): d ticks from now, in ms.
local function ms(d, r, sub)
  if d < 0 then
    return -1
  elseif d == 0 then
    return 0
  end
  return d * r - sub
end

local function retry(limit, ticks, e, p, c, cost)
  if cost > limit then
    return -1
  end
  local a = limit - c - cost
  if a >= 0 then
    if p == 0 then
      return 0
    end
    return math.max(0, ticks - 1 - e - math.floor(a * ticks / p))
  end
  return ticks - e + math.max(0, ticks - 1 - math.floor((limit - cost) * ticks / c))
end

local out = {all and 1 or 0, now}
for i = 1, n do
  local limit, w, r, cost = L[i], W[i], R[i], COST[i]
  local s, p, c = S[i], P[i], C[i]
  local pre = c
  if charge and all then
    c = c + cost
  end
  local ticks = w / r
  local off = AT[i] - s
  local e = math.floor(off / r)
  local sub = off - e * r
  p, c = math.min(p, limit + 1), math.min(c, limit + 1)
  local free = limit * ticks - (p * (ticks - 1 - e) + c * ticks)
  local remaining = 0
  if free > 0 then
    remaining = math.floor(free / ticks)
  end
  local reset = 0
  if c > 0 then
    reset = ms(2 * ticks - 1 - e, r, sub)
  elseif p > 0 then
    reset = ms(ticks - 1 - e, r, sub)
  end
  local retry_ms, next_ms = 0, 0
  if not OK[i] then
    retry_ms = ms(retry(limit, ticks, e, p, c, cost), r, sub)
    next_ms = ms(retry(limit, ticks, e, p, c, 1), r, sub)
  elseif remaining < limit then
    -- Until remaining grows: within this window, free grows by p a tick.
    local need = (remaining + 1) * ticks - free
    local d = -1
    if p > 0 then
      d = math.floor((need + p - 1) / p)
      if e + d > ticks - 1 then
        d = -1
      end
    end
    if d < 0 then
      -- In the next window, y ticks in: c*(ticks-1-y) <= (limit-remaining-1)*ticks.
      local y = 0
      if c > 0 then
        y = math.max(0, ticks - 1 - math.floor((limit - remaining - 1) * ticks / c))
      end
      d = ticks - e + y
    end
    next_ms = ms(d, r, sub)
  end
  local k = #out
  out[k + 1] = OK[i] and 1 or 0
  out[k + 2] = remaining
  out[k + 3] = reset
  out[k + 4] = retry_ms
  out[k + 5] = next_ms
  out[k + 6] = s
  out[k + 7] = P[i]
  out[k + 8] = pre
  out[k + 9] = RAW[i][1]
  out[k + 10] = RAW[i][2]
  out[k + 11] = RAW[i][3]
end
return out
