-- Leases and write-back deltas of the fleet modes: the Redis side of
-- internal/fleet (Grant and Apply), on the counters decide.lua keeps, in
-- the same fields and forms (see decide.lua), so that a rule may move
-- between exact, lease and write-back without resetting its clients.
--
-- A batch script (redispipe.NewBatchScript): ARGV[1] is the number of
-- calls, ARGV[2] their numbers of keys and arguments, then one argument per
-- call; each call has one key, the bucket. Its argument, in 8-byte
-- little-endian integers unless said otherwise: now in Unix ms (-1 for
-- the server's clock, TIME), the operation (one byte: "W" to apply a
-- delta, "L" to lease), the counter's field (12 bytes), the algorithm's
-- code (one character) and its numbers:
--   "0" sliding window        limit, window, tick
--   "1" fixed window          limit, window
--   "4" fixed calendar period limit, b0, b1, b2, b3 (as in decide.lua)
--   "3" token bucket          requests, capacity, window, tick
-- then for "W": the delta's window start, its previous and current counts
-- (for a token bucket, tokens in the current count); for "L": the most to
-- grant, the units to give back, the start of the window they were counted
-- in, the app server's id (below 2^32) and the instant its lease ends.
--
-- A lease records its holder in the field's companion (the field followed
-- by "h"): 10 bytes per holder, "<I4i6", its id and the end of its lease.
-- The number of holders whose lease has not ended, this one included, is
-- the "servers" of fleet.LeaseSize. A call that asks for nothing and gives
-- back (a lease that ends) removes its holder.
--
-- Reply: a string of 8-byte integers: now, the units granted (0 for "W"),
-- the servers seen (0 for "W"), then the counter after the call, rolled to
-- now: start, prev, curr (a fixed window's prev is 0; a token bucket's are
-- the instant of the level, its tick and the level).

local unpack, pack, sub = struct.unpack, struct.pack, string.sub
local floor, min, max = math.floor, math.min, math.max
local clock
local calls = ARGV[1] + 0
local replies = {}
-- one decides one call: req is its argument and key its bucket.
local function one(req, key)
  local now, op, field, code = unpack('<i8c1c12c1', req)
  local a = 23
  if now < 0 then
    if not clock then
      local t = redis.call('TIME')
      clock = t[1] * 1000 + floor(t[2] / 1000)
    end
    now = clock
  end
  local v = redis.call('HGET', key, field)
  local s, p, c, at, rem, exp, value
  -- s0 is the stored window's start (or the token bucket's stored
  -- expiry), -1 if none: the bucket's expiry is extended only when the
  -- counter's moves, as decide.lua does.
  local s0 = -1
  local limit, w, r, b0, b1, b2, b3, rate, burst, win
  if code == '0' then
    limit, w, r = unpack('<i8i8i8', req, a)
    a = a + 24
    -- window.Roll
    s, p, c = 0, 0, 0
    if v and #v == 32 then
      s, p, c = unpack('<ddd', v)
      s0 = s
    end
    at = now
    if p == 0 and c == 0 then
      s = now
    elseif now < s then
      at = s
    else
      local k = floor((now - s) / w)
      if k == 1 then
        s, p, c = s + w, c, 0
      elseif k >= 2 then
        p, c = 0, 0
      end
      if p == 0 and c == 0 then
        s = now
      end
    end
  elseif code == '1' or code == '4' then
    if code == '1' then
      limit, w = unpack('<i8i8', req, a)
      a = a + 16
    else
      limit, b0, b1, b2, b3 = unpack('<i8i8i8i8i8', req, a)
      a = a + 40
    end
    s, p, c = -1, 0, 0
    local e0 = 0
    if v and #v == 21 and string.byte(v, 1) == 70 then
      local _
      _, e0, s, c = unpack('<Bi6i6d', v)
      s0 = s
    end
    at = now
    if c == 0 or now >= s then
      local ws, we
      if code == '1' then
        ws = now - now % w
        we = ws + w
      elseif now >= b1 and now < b2 then
        ws, we = b1, b2
      elseif now >= b2 and now < b3 then
        ws, we = b2, b3
      elseif now >= b0 and now < b1 then
        ws, we = b0, b1
      else
        return redis.error_reply('ERR sluice: instant outside the calendar periods worked out by the caller')
      end
      if c == 0 or s ~= ws then
        s, c = ws, 0
      end
      exp = we
    else
      exp = e0
    end
  elseif code == '3' then
    rate, burst, win, r = unpack('<i8i8i8i8', req, a)
    a = a + 32
    w = win / r
    -- window.Limit.Roll for a token bucket (decide.lua's rollToken).
    local t0, r0, l0 = -1, 0, 0
    if v and #v == 27 and string.byte(v, 1) == 84 then
      local _, e
      _, e, t0, r0, l0 = unpack('<Bi6i6i6d', v)
      if e <= now then
        t0, r0, l0 = -1, 0, 0
      else
        s0 = e
      end
    end
    local base = now - now % r
    at = now
    if l0 <= 0 then
      s, c = base, 0
    else
      local level, st = l0, t0
      if r0 ~= r and r0 > 0 then
        local ow = max(floor(win / r0), 1)
        level = min(floor((level + ow - 1) / ow), 2 * (burst + 1)) * w
        if base >= st then
          st = min(st + r0 - 1, base)
        end
        st = st - st % r
      end
      level = min(level, 2 * (burst + 1) * w)
      if base < st then
        s, c, at = st, level, st
      else
        local elapsed = floor((base - st) / r)
        if elapsed >= floor((level + rate - 1) / rate) then
          level = 0
        else
          level = level - elapsed * rate
        end
        s, c = base, level
      end
    end
    p = r
  else
    return redis.error_reply('ERR sluice: fleet: unknown algorithm code ' .. tostring(code))
  end

  -- remaining is fleet.Remaining: the most that fits now.
  local function remaining()
    local free
    if code == '0' then
      -- (limit-c)*ticks - p*(ticks-1-e), exact: a previous count past
      -- limit + 1 (a debt) is compared by division (window.Fits).
      local ticks = w / r
      local k = ticks - 1 - floor((at - s) / r)
      if c >= limit or (p > limit + 1 and k > 0 and p > floor((limit - c) * ticks / k)) then
        free = 0
      else
        free = floor(((limit - c) * ticks - p * k) / ticks)
      end
    elseif code == '3' then
      free = floor((burst * w - c) / w)
    else
      free = limit - c
    end
    return max(free, 0)
  end

  local granted, servers = 0, 0
  local changed = false
  if op == 'W' then
    local ds, dp, dc = unpack('<i8i8i8', req, a)
    if code == '3' then
      if dc > 0 then
        c, changed = c + dc * w, true
      end
    elseif code ~= '0' then
      if ds == s and dc > 0 then
        c, changed = c + dc, true
      end
    elseif dp ~= 0 or dc ~= 0 then
      if p == 0 and c == 0 then
        if now < ds + w then
          s, p, c, changed = ds, dp, dc, true
        elseif now < ds + 2 * w and dc ~= 0 then
          s, p, c, changed = ds + w, dc, 0, true
        end
      else
        if ds + w - 1 >= s then
          c = c + dc
        elseif ds + w - 1 >= s - w then
          p = p + dc
        end
        if ds - 1 >= s then
          c = c + dp
        elseif ds - 1 >= s - w then
          p = p + dp
        end
        changed = true
      end
    end
  else
    local want, give, from, id, untl = unpack('<i8i8i8i8i8', req, a)
    if give > 0 then
      if code == '3' then
        c = max(0, c - give * w)
      elseif from == s then
        c = max(0, c - give)
      elseif code == '0' and from == s - w then
        p = max(0, p - give)
      end
      changed = true
    end
    -- The holders of leases on this counter.
    local hf = field .. 'h'
    local hv = redis.call('HGET', key, hf)
    local kept = {}
    if hv then
      for o = 1, #hv - 9, 10 do
        local hid, hu = unpack('<I4i6', hv, o)
        if hu > now and hid ~= id and #kept < 63 then
          kept[#kept + 1] = sub(hv, o, o + 9)
        end
      end
    end
    if want > 0 or give == 0 then
      kept[#kept + 1] = pack('<I4i6', id, untl)
    end
    servers = #kept
    if want > 0 then
      -- fleet.LeaseSize
      local rm = remaining()
      if rm > 0 then
        granted = min(want, rm, max(floor(rm / (2 * max(servers, 1))), 1))
      end
      if granted > 0 then
        if code == '3' then
          c = c + granted * w
        else
          c = c + granted
        end
        changed = true
      end
    end
    if #kept == 0 then
      if hv then
        redis.call('HDEL', key, hf)
      end
    else
      redis.call('HSET', key, hf, table.concat(kept))
    end
  end

  -- The bucket's expiry is extended (PEXPIRE GT, never shortened) when
  -- the counter's moves: a new window, or a token bucket's expiry rounded
  -- up to whole windows (as decide.lua does). A bucket this call may have
  -- made (the counter was absent) gets NX when GT changed nothing, since
  -- GT leaves a key without an expiry alone.
  local ttl
  if changed then
    if code == '0' then
      value = pack('<dddd', s, p, c, w)
      if s ~= s0 then
        ttl = s + 2 * w - now
      end
    elseif code == '3' then
      local e = min(s + floor((c + rate - 1) / rate) * r, 140737488355327)
      value = pack('<Bi6i6i6d', 84, e, s, r, c)
      e = e + (win - e % win) % win
      if s0 < 0 or e > s0 + (win - s0 % win) % win then
        ttl = e - now
      end
    else
      value = pack('<Bi6i6d', 70, exp, s, c)
      if s ~= s0 then
        ttl = exp - now
      end
    end
    redis.call('HSET', key, field, value)
  elseif op == 'L' and not v then
    -- Only the holders were written, maybe to a new bucket: they matter
    -- until the lease ends.
    local _, _, _, _, untl = unpack('<i8i8i8i8i8', req, a)
    ttl = untl - now
  end
  if ttl then
    ttl = max(1, ttl)
    if redis.call('PEXPIRE', key, ttl, 'GT') == 0 and not v then
      redis.call('PEXPIRE', key, ttl, 'NX')
    end
  end
  return pack('<i8i8i8i8i8i8', now, granted, servers, s, p, c)
end

local ab = 2
for q = 1, calls do
  local _, na = unpack('<HH', ARGV[2], 4 * q - 3)
  replies[q] = one(ARGV[ab + 1], KEYS[q])
  ab = ab + na
end
if calls == 1 then
  return replies[1]
end
return replies
