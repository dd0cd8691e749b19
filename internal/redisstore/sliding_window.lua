-- Sliding-window counter: the Redis side of window.Take (internal/window).
-- It rolls and checks every counter of a request with the same integer
-- arithmetic as window.Roll and window.Fits, and charges them all or none;
-- the Go side describes the decision (window.Describe) from the states this
-- script returns, so the two cannot disagree on the figures either.
--
-- KEYS[i]  the bucket of charge i: a HASH holding the counters of many
--          clients, one field per counter.
-- ARGV[1]  now in Unix ms, or "" to read the server's clock (TIME).
-- ARGV[2]  "1" to charge, "0" for a dry run that decides but never writes.
-- ARGV[5i-2] .. ARGV[5i+2]
--          field, limit, window in ms, tick in ms and cost of charge i.
--
-- A counter is the field's value: four doubles packed little-endian
-- (struct "<dddd"), the start of its current window (Unix ms), the counts
-- of the previous and current windows, and the window in ms (so that any
-- request can tell an expired field of another counter and drop it). A
-- value of any other length is taken as absent. A bucket expires no sooner
-- than two windows after its counters' current windows started, like each
-- of them; a field past that is treated as absent, and up to two such
-- fields are dropped each time a new field is added to the bucket.
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
-- Reply: {allowed_all, now, then per charge i: allowed, start, prev, curr,
-- stored_start, stored_prev, stored_curr}, where start, prev and curr are
-- the counter rolled to now before this request's cost was added, and the
-- stored_ values are the counter as it was read (stored_start is -1 if
-- there was none).

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local charge = ARGV[2] == '1'
local n = #KEYS
local unpack = struct.unpack

-- st[i]: {start, prev, curr, stored_start, stored_prev, stored_curr, cost,
-- window, ok}
local st = {}
local all = true
for i = 1, n do
  local a = 5 * i - 2
  local limit, w, r, cost = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local v = redis.call('HGET', KEYS[i], ARGV[a])
  local s, p, c, s0
  if v and #v == 32 then
    s, p, c = unpack('<dddd', v)
    s0 = s
  else
    s, p, c, s0 = 0, 0, 0, -1
  end
  local p0, c0 = p, c
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
  local ok = cost <= limit and
    math.min(p, limit + 1) * (ticks - 1 - e) + (math.min(c, limit + 1) + cost) * ticks <= limit * ticks
  st[i] = {s, p, c, s0, p0, c0, cost, w, ok}
  all = all and ok
end

if charge and all then
  -- One write per counter, with every cost charged to it: the first charge
  -- of a counter writes the total.
  local total = {}
  if n == 1 then
    total[1] = st[1][7]
  else
    local first = {}
    for i = 1, n do
      local id = KEYS[i] .. '\0' .. ARGV[5 * i - 2]
      local j = first[id]
      if j == nil then
        first[id] = i
        total[i] = st[i][7]
      else
        total[j] = total[j] + st[i][7]
      end
    end
  end
  -- fresh[key]: the bucket did not exist before this request.
  local sampled, fresh = {}, {}
  for i = 1, n do
    local x = st[i]
    if total[i] and total[i] > 0 then
      local key, field, w = KEYS[i], ARGV[5 * i - 2], x[8]
      if x[4] < 0 and not sampled[key] then
        -- A new counter: drop up to two expired counters of other clients.
        -- An empty sample means a new bucket.
        sampled[key] = true
        local sample = redis.call('HRANDFIELD', key, 2, 'WITHVALUES')
        fresh[key] = #sample == 0
        for j = 1, #sample, 2 do
          local sv = sample[j + 1]
          if #sv == 32 then
            local ss, _, _, sw = unpack('<dddd', sv)
            if ss + 2 * sw <= now and sample[j] ~= field then
              redis.call('HDEL', key, sample[j])
            end
          end
        end
      end
      redis.call('HSET', key, field, struct.pack('<dddd', x[1], x[2], x[3] + total[i], w))
      if x[1] ~= x[4] then
        -- A new window (or counter): the bucket must outlive it by the
        -- rest of it plus the next one (window.Expiry). Expiries are only
        -- ever extended, so that the bucket outlives all its counters;
        -- every bucket has one from its first write on.
        local ttl = math.max(1, x[1] + 2 * w - now)
        if fresh[key] then
          redis.call('PEXPIRE', key, ttl)
          fresh[key] = false
        else
          redis.call('PEXPIRE', key, ttl, 'GT')
        end
      end
    end
  end
end

local out = {all and 1 or 0, now}
for i = 1, n do
  local x = st[i]
  local k = #out
  out[k + 1] = x[9] and 1 or 0
  out[k + 2] = x[1]
  out[k + 3] = x[2]
  out[k + 4] = x[3]
  out[k + 5] = x[4]
  out[k + 6] = x[5]
  out[k + 7] = x[6]
end
return out
