-- Sliding-window counter: the Redis side of window.Take (internal/window).
--
-- KEYS[i]  one HASH per counter, fields s (window start, Unix ms),
--          p (previous window's count) and c (current window's count).
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  "1" to charge, "0" for a dry run that decides but never writes.
-- ARGV[3i], ARGV[3i+1], ARGV[3i+2]
--          limit, window in ms and cost of charge i.
--
-- Every charge is decided at one instant, against the counters as they were
-- before the request; the costs are added only if every charge fits. Only
-- the counters of admitted charges with a cost are written: a denied request
-- or a read (cost 0) changes nothing. Two charges may name the same counter;
-- each is then decided on its own and both costs are counted.
--
-- All numbers are integers below 2^53 (window.Limit.Validate bounds limit *
-- window by 2^50, and the caller caps a cost at limit + 1), so the double
-- arithmetic of Lua is exact; divisions are floored explicitly.
--
-- Reply: {allowed_all, now, then per charge i: allowed, remaining, reset_ms,
-- retry_ms, start, prev, curr, stored_start, stored_prev, stored_curr},
-- where start, prev and curr are the counter rolled to now before this
-- request's cost was added, and the stored_ values are the fields as they
-- were read (stored_start is -1 if the key did not exist). retry_ms is -1
-- when the cost exceeds the limit.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local charge = ARGV[2] == '1'
local n = #KEYS

local S, P, C, AT, OK, ROLLED, RAW = {}, {}, {}, {}, {}, {}, {}
local all = true
for i = 1, n do
  local limit, w, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local h = redis.call('HMGET', KEYS[i], 's', 'p', 'c')
  local s, p, c = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  RAW[i] = {tonumber(h[1]) or -1, p, c}
  -- Roll (window.Roll).
  local start = now - now % w
  local at = now
  local rolled = true
  if start == s then
    rolled = false
  elseif start < s then
    -- The clock went backwards: decide at the start of the stored window.
    at = s
    rolled = false
  elseif start == s + w then
    s, p, c = start, c, 0
  else
    s, p, c = start, 0, 0
  end
  -- Fits (window.Fits).
  local ok = p * (w - (at - s)) + (c + cost) * w <= limit * w
  S[i], P[i], C[i], AT[i], OK[i], ROLLED[i] = s, p, c, at, ok, rolled
  all = all and ok
end

if charge and all then
  -- A key named by two charges is rolled once and gets both costs.
  local written = {}
  for i = 1, n do
    local w, cost = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
    if cost > 0 then
      if ROLLED[i] and not written[KEYS[i]] then
        redis.call('HSET', KEYS[i], 's', S[i], 'p', P[i], 'c', C[i] + cost)
      else
        redis.call('HINCRBY', KEYS[i], 'c', cost)
      end
      written[KEYS[i]] = true
      -- window.Expiry: the rest of this window plus the next one.
      redis.call('PEXPIRE', KEYS[i], math.max(1, S[i] + 2 * w - now))
    end
  end
end

local out = {all and 1 or 0, now}
for i = 1, n do
  local limit, w, cost = tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2])
  local s, p, c, at = S[i], P[i], C[i], AT[i]
  local pre = c
  if charge and all then
    c = c + cost
  end
  -- Describe (window.Describe).
  local elapsed = at - s
  local free = limit * w - (p * (w - elapsed) + c * w)
  local remaining = 0
  if free > 0 then
    remaining = math.floor(free / w)
  end
  local reset = 0
  if c > 0 then
    reset = 2 * w - elapsed
  elseif p > 0 then
    reset = w - elapsed
  end
  local retry = 0
  if not OK[i] then
    if cost > limit then
      retry = -1
    else
      local a = limit - c - cost
      if a >= 0 then
        if p > 0 then
          retry = math.max(0, w - elapsed - math.floor(a * w / p))
        end
      else
        retry = w - elapsed + w - math.floor((limit - cost) * w / c)
      end
    end
  end
  local k = #out
  out[k + 1] = OK[i] and 1 or 0
  out[k + 2] = remaining
  out[k + 3] = reset
  out[k + 4] = retry
  out[k + 5] = s
  out[k + 6] = p
  out[k + 7] = pre
  out[k + 8] = RAW[i][1]
  out[k + 9] = RAW[i][2]
  out[k + 10] = RAW[i][3]
end
return out
