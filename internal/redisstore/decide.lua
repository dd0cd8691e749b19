-- Decisions of every algorithm: the Redis side of window.Take
-- (internal/window). It rolls and checks every counter of a request with
-- the same integer arithmetic as window.Limit.Roll and window.Fits, and
-- charges them all or none (window.Add); the Go side describes the
-- decision (window.Describe, or window.DescribeLog for a sliding log) from
-- the states and summaries this script returns, so the two cannot disagree
-- on the figures either. One run decides together the charges of every
-- algorithm that a request names.
--
-- One run decides many requests, as redispipe.NewBatchScript describes:
-- ARGV[1] is the number of requests, ARGV[2] the numbers of keys and of
-- arguments of each (2-byte integers), then come the requests' arguments
-- in turn; KEYS holds each request's keys in turn, and the reply is the
-- array of each request's reply (or error reply), or for a run of one
-- request that request's reply itself. Requests are decided one
-- after the other, each seeing what those before it wrote; requests in a
-- row for one counter read it once and write it once. The server's clock
-- is read once, for the first request that needs it. Every number is an
-- 8-byte little-endian signed integer (struct "<i8"), which spares the
-- script parsing decimal strings. For one request:
--
-- KEYS[i]  the bucket of charge i: a HASH holding the counters of many
--          clients, one field per counter.
-- One argument: now in Unix ms (-1 to read the server's clock, TIME), one
-- byte (1 to charge, 0 for a dry run that decides but never writes, 2 to
-- settle: charge every cost whether it fits or not, window.SettleAll), then
-- for each charge in turn its field (12 bytes), its algorithm's code (one
-- character) and that algorithm's numbers (durations in ms):
--   "0" sliding window        limit, window, tick, cost
--   "1" fixed window          limit, window, cost
--   "2" sliding log           limit, window, cost
--   "3" token bucket          requests (refilled per window), capacity,
--                             window, tick, cost
--   "4" fixed calendar period limit, cost, b0, b1, b2, b3
--   "5" leaky bucket          requests (drained per window), capacity (the
--                             queue + 1), window, tick, the longest wait in
--                             ticks (-1 for none), cost
--
-- Fixed windows aligned to the Unix epoch are worked out here, from the
-- window. A calendar period (a day, week or month in a time zone) is not a
-- fixed duration, and Redis has no time-zone database: b0 < b1 < b2 < b3
-- are four consecutive period boundaries that the caller worked out around
-- its own clock, or around the explicit now (window.Limit.Boundaries),
-- and the script picks among [b0,b1), [b1,b2) and [b2,b3) the period that
-- contains its instant. An instant outside [b0, b3), which means that the
-- caller's clock is more than a whole period away from Redis's, fails the
-- whole request with an error reply, before anything is written.
--
-- A counter is its field's value, in one of these forms; a value of no
-- form, or not of its algorithm's, is taken as absent:
--   sliding window  32 bytes, struct "<dddd": the start of the current
--                   window (Unix ms), the counts of the previous and
--                   current windows, and the window in ms.
--   fixed window    21 bytes, "<Bi6i6d": "F", the end of the window, its
--                   start, and its count.
--   token bucket    27 bytes, "<Bi6i6i6d": "T", the instant the bucket is
--   and leaky       full again (empty, for a leaky bucket) at the refill of
--   bucket          the limit last charged (at most 2^47 - 1), the instant
--                   of the level, the tick it is counted in, and the level
--                   (the drops spent, or queued: internal/window/token.go
--                   and leaky.go).
--   sliding log     11 + 10n bytes: "<Bi6I4", "L", the instant the newest
--                   entry leaves the window, and the sum of the entries'
--                   counts; then n >= 1 entries "<i6I4", the instant and
--                   the count of each, oldest first, one per instant.
-- Every value thus tells when it stops mattering (window.ExpiryOf): two
-- windows after the start of its current one for a sliding window, the
-- instant stored first for the others. A field past that is treated as
-- absent (for a token bucket whose refill was lowered since, that is
-- sooner than the level would say), and when a new field is added to the
-- bucket, such fields of other counters are dropped from a sample of it
-- (see prune) that holds two fields per new field on average. A
-- bucket's expiry is extended (PEXPIRE GT, never shortened) to the expiry
-- of every counter written, so that it outlives them all.
--
-- Every charge is decided at one instant, against the counters as they were
-- before the request; the costs are added only if every charge fits (or
-- whatever they fit, for a settle, capped as window.Settle caps them: a
-- count at 2^52, a token bucket's level at 2 * (capacity + 1) tokens, a
-- log's sum at 2^32 - 1; the reply then gives a log's retry_1 of the log
-- after the charge, the entry that lets one unit fit again). Only
-- the counters of admitted charges with a cost are written: a denied
-- request or a read (cost 0) changes nothing. Two charges may name the same
-- counter; each is then decided on its own and both costs are counted, as
-- though each came in turn (a token bucket's level is rolled again under
-- each charge's limit before its cost is added).
--
-- All numbers are integers below 2^53 (window.Limit.Tick chooses the tick
-- so that 3 * (limit + 1) * ticks <= 2^53, a previous count above
-- limit + 1 is compared by division rather than by its product, counts
-- stay below 2^52, and the caller caps a cost at capacity + 1, but for a
-- settle), so the double arithmetic of Lua is exact; divisions are floored
-- explicitly. Instants stored as "i6"
-- must be below 2^47 ms (the year 6429), which the caller checks, and a
-- log's counts below 2^32, which its limit of at most 100,000 ensures.
--
-- Reply: a string of 8-byte little-endian signed integers, allowed_all and
-- now, then 7 integers per charge: allowed, then
--   sliding window, fixed window, token bucket: the counter rolled to now
--     before this request's cost was added (start, prev, curr), and the
--     counter as it was read (stored start, or -1 if there was none, prev,
--     curr). A fixed window's prev is 0. A token bucket's rolled prev is
--     the tick passed, which the caller knows: the stored expiry (-1 if
--     none) takes its place; its stored prev is the tick the stored level
--     is counted in.
--   sliding log: the summary of the log rolled to now, before the cost was
--     added (window.LogSummary: count, oldest, newest, retry_c, retry_1),
--     and the instant it was decided at.

local unpack, pack, byte, sub = struct.unpack, struct.pack, string.byte, string.sub
local floor, min, max = math.floor, math.min, math.max
-- now is the instant the request being decided is decided at; clock is
-- the server's (TIME), read once per run, when a request first needs it.
local now, clock

-- instant returns the instant to decide a request at: at0, or the
-- server's clock (TIME, read once per run) when at0 is -1.
local function instant(at0)
  if at0 >= 0 then
    return at0
  end
  if not clock then
    local t = redis.call('TIME')
    local us = t[2] + 0
    clock = t[1] * 1000 + (us - us % 1000) / 1000
  end
  return clock
end
-- slidingFits is window.Roll and window.Fits for a sliding window of w ms
-- counted in ticks of r ms: the counter (start s, counts p and c; all 0
-- for none) rolled to now, and whether cost more fits under limit. It
-- returns ok, then the rolled s, p and c. A clock that went backwards
-- (now before s) is decided at the start of the stored window. Floors are
-- arithmetic, (x - x % d) / d (see below).
local function slidingFits(s, p, c, limit, w, r, cost)
  local at = now
  if p == 0 and c == 0 then
    s = now
  elseif now < s then
    at = s
  else
    local d = now - s
    local k = (d - d % w) / w
    if k == 1 then
      s, p, c = s + w, c, 0
    elseif k >= 2 then
      p, c = 0, 0
    end
    if p == 0 and c == 0 then
      s = now
    end
  end
  -- In ticks: p * (ticks-1-e) <= (limit-c-cost) * ticks, by division
  -- when p is above limit + 1 (a debt), so that no product passes 2^53.
  if cost > limit or c > limit - cost then
    return false, s, p, c
  end
  local ticks, e = w / r, at - s
  e = (e - e % r) / r
  local k, a = ticks - 1 - e, (limit - c - cost) * ticks
  if p <= limit + 1 then
    return p * k <= a, s, p, c
  end
  return k == 0 or p <= (a - a % k) / k, s, p, c
end

-- The counter last read or written in this run (bucket lkey, field lfield,
-- value lval, false if none), so that requests in a row for one counter
-- cost one HGET and one HSET: its write waits (ldirty) until the run
-- reads another counter or ends, with the TTL its bucket is to be
-- extended to then (lttl, 0 for none). Scalars, not a table of counters:
-- making and filling tables on every run costs more than it saves when
-- requests are for different counters.
local lkey, lfield, lval, ldirty, lttl = false, false, false, false, 0

-- One call of one sliding-window charge of a counter that exists, the
-- commonest call when decisions come one at a time, is decided here,
-- before the helpers of the general path below are made, which would cost
-- it a third of its time; the general path decides it alike (see the
-- fast path of the loop, which this repeats for a run of one call).
if ARGV[1] == '1' and #KEYS == 1 then
  local req = ARGV[3]
  if #req == 54 then
    local at0, mode, field, code, limit, w, r, cost = unpack('<i8Bc12c1i8i8i8i8', req)
    if code == '0' then
      local key = KEYS[1]
      local v = redis.call('HGET', key, field)
      if v and #v == 32 then
        now = instant(at0)
        local s0, p0, c0 = unpack('<ddd', v)
        local ok, s, p, c = slidingFits(s0, p0, c0, limit, w, r, cost)
        if (ok and mode == 1 or mode == 2) and cost > 0 then
          local n = c + cost
          if n > 4503599627370496 then
            n = 4503599627370496 -- 2^52: a settle's cap
          end
          redis.call('HSET', key, field, pack('<dddd', s, p, n, w))
          if s ~= s0 then
            local ttl = s + 2 * w - now
            redis.call('PEXPIRE', key, ttl < 1 and 1 or ttl, 'GT')
          end
        end
        local b = ok and 1 or 0
        return pack('<i8i8i8i8i8i8i8i8i8', b, now, b, s, p, c, s0, p0, c0)
      end
      -- The general path goes on from the counter read.
      lkey, lfield, lval = key, field, v
    end
  end
end
-- Tables that every request of the general path reuses, since requests
-- are decided one at a time: st (see below), and total and link of a
-- request with one charge; made on first use.
local stShared, total1, noLink

-- The buckets sampled for expired counters in this run, and whether each
-- bucket that a counter was added to did not exist before (fresh[key]:
-- true, false, or 'maybe' when it was not sampled); made when a request
-- adds a counter. Expiries are only ever extended, so that a bucket
-- outlives all its counters; every bucket has one from its first write on:
-- one known not to have existed gets a plain PEXPIRE, since GT leaves a
-- key without a TTL alone, and one that may not have existed gets NX when
-- GT changed nothing.
local sampled, fresh

-- extend makes bucket key live at least ttl ms more (see fresh).
local function extend(key, ttl)
  local f = fresh and fresh[key]
  if f == true then
    redis.call('PEXPIRE', key, ttl)
  elseif redis.call('PEXPIRE', key, ttl, 'GT') == 0 and f == 'maybe' then
    redis.call('PEXPIRE', key, ttl, 'NX')
  end
  if f then
    fresh[key] = false
  end
end

-- flush writes the last counter, if its write waits.
local function flush()
  if ldirty then
    redis.call('HSET', lkey, lfield, lval)
    if lttl > 0 then
      extend(lkey, lttl)
    end
    ldirty = false
  end
end

-- expired(sv) reports whether the value sv of a field of any algorithm
-- has stopped mattering at now; values of no known form are kept.
local function expired(sv)
  local len = #sv
  if len == 32 then
    local ss, _, _, sw = unpack('<dddd', sv)
    return ss + 2 * sw <= now
  end
  local tag = byte(sv, 1)
  if (len == 21 and tag == 70) or (len == 27 and tag == 84) or
    (len >= 21 and (len - 11) % 10 == 0 and tag == 76) then
    return unpack('<i6', sv, 2) <= now
  end
  return false
end

-- prune is called before field, a new counter, is added to bucket key at
-- now. For one new counter in four, those whose last byte plus now is a
-- multiple of 4 (the field is a hash, now moves on every millisecond), it
-- samples up to 8 counters of the bucket and drops those of other clients
-- that have expired: as many, on average, as sampling 2 for every new
-- counter would, for a quarter of the commands. A bucket is sampled at
-- most once per run; an empty sample means a new bucket.
local function prune(key, field)
  if not sampled then
    sampled, fresh = {}, {}
  end
  if (byte(field, 12) + now) % 4 ~= 0 or sampled[key] then
    if fresh[key] == nil then
      fresh[key] = 'maybe'
    end
    return
  end
  sampled[key] = true
  local sample = redis.call('HRANDFIELD', key, 8, 'WITHVALUES')
  fresh[key] = #sample == 0
  for j = 1, #sample, 2 do
    local f = sample[j]
    if f ~= field and expired(sample[j + 1]) then
      redis.call('HDEL', key, f)
      if lkey == key and lfield == f and not ldirty then
        lval = false
      end
    end
  end
end
-- Helpers, made on first use: making these closures on every run would
-- cost the sliding-window path a tenth of its time.
--   rollToken(s, r0, level, rate, burst, win, r, w) is window.Limit.Roll
--     for a token bucket: the state (start s, tick r0, level) rolled to
--     now under a limit of rate per window win, with the capacity burst
--     and ticks of r ms (w of them per window). It returns the new start
--     and level, and the instant to decide at.
--   leaving(v, first, need) is the instant of the entry of log v (entries
--     from byte first on) whose leaving frees need units, or -1 if none
--     does.
local rollToken, leaving

-- The batch protocol of redispipe.NewBatchScript: ARGV[1] requests, the
-- numbers of keys and arguments of each, then their arguments in turn.
-- Request q has n keys, after KEYS[kb], and its arguments follow ARGV[ab].
-- A request whose reply is an error reply (fail) fails alone; an error
-- that Redis raises fails the run, and what it wrote stays written, as for
-- a script of one request.
--
-- Each C function call costs a run about as much as a Redis command's
-- dispatch does, so the commonest request is read with one unpack, and
-- the clock and slidingFits floor with arithmetic (x - x % d) / d
-- rather than math.floor, which is exact for the integers involved (all
-- below 2^53, x >= 0, d > 0).
local calls = ARGV[1] + 0
local replies = {}
local kb, ab = 0, 2
for q = 1, calls do
  local n, na = unpack('<HH', ARGV[2], 4 * q - 3)
  local req = ARGV[ab + 1]
  -- A request of one sliding-window charge is 54 bytes long.
  local at0, mode, field1, code1, limit1, w1, r1, cost1
  if n == 1 and #req == 54 then
    at0, mode, field1, code1, limit1, w1, r1, cost1 = unpack('<i8Bc12c1i8i8i8i8', req)
  else
    at0, mode = unpack('<i8B', req)
  end
  local fail, reply
  now = instant(at0)
  local charge, force = mode >= 1, mode == 2

  -- The commonest request, one sliding-window charge of a counter that
  -- exists or of a new one, is decided here with scalars; the general
  -- path below decides every other request (and would decide this one
  -- alike: a counter is read once, whichever path decides it).
  local fast = false
  if code1 == '0' then
    local key, field = KEYS[kb + 1], field1
    if lfield ~= field or lkey ~= key then
      flush()
      lkey, lfield, lval, ldirty, lttl = key, field, redis.call('HGET', key, field), false, 0
    end
    fast = not lval or #lval == 32
  end
  if fast then
    -- Decided by slidingFits as in the general path, a new counter too
    -- (stored start -1); the write waits in the last-counter scalars.
    local w, cost = w1, cost1
    local s0, p0, c0 = -1, 0, 0
    if lval then
      s0, p0, c0 = unpack('<ddd', lval)
    end
    local ok, s, p, c = slidingFits(s0, p0, c0, limit1, w, r1, cost)
    if (ok and charge or force) and cost > 0 then
      if s0 < 0 then
        prune(lkey, lfield)
      end
      local n = c + cost
      if n > 4503599627370496 then
        n = 4503599627370496
      end
      lval, ldirty = pack('<dddd', s, p, n, w), true
      if s ~= s0 then
        local ttl = s + 2 * w - now
        if ttl < 1 then
          ttl = 1
        end
        if ttl > lttl then
          lttl = ttl
        end
      end
    end
    local b = ok and 1 or 0
    reply = pack('<i8i8i8i8i8i8i8i8i8', b, now, b, s, p, c, s0, p0, c0)
  else
    -- st[i]: {allowed, the 6 integers of the reply after it, cost, field,
    -- code, absent, then what the write needs}
    if not stShared then
      stShared, total1, noLink = {}, {}, {}
    end
    local st = stShared
    local all = true
    local a = 10
    for i = 1, n do
      local field, code = sub(req, a, a + 11), sub(req, a + 12, a + 12)
      local key = KEYS[kb + i]
      local v
      if lfield == field and lkey == key then
        v = lval
      else
        flush()
        v = redis.call('HGET', key, field)
        lkey, lfield, lval, ldirty, lttl = key, field, v, false, 0
      end
      local x
      if code == '0' then
        -- Sliding window: window.Roll and window.Fits.
        local limit, w, r, cost = unpack('<i8i8i8i8', req, a + 13)
        a = a + 45
        local s, p, c, s0
        if v and #v == 32 then
          s, p, c = unpack('<dddd', v)
          s0 = s
        else
          s, p, c, s0 = 0, 0, 0, -1
        end
        local p0, c0 = p, c
        local ok
        ok, s, p, c = slidingFits(s, p, c, limit, w, r, cost)
        x = {ok, s, p, c, s0, p0, c0, cost, field, code, s0 < 0, w}
      elseif code == '3' or code == '5' then
        -- Token bucket (internal/window/token.go), and the leaky bucket, which
        -- is one whose level may hold the queue and may bound the wait
        -- (leaky.go).
        local rate, burst, win, r, cost, wait
        if code == '5' then
          rate, burst, win, r, wait, cost = unpack('<i8i8i8i8i8i8', req, a + 13)
          a = a + 61
        else
          rate, burst, win, r, cost = unpack('<i8i8i8i8i8', req, a + 13)
          wait = -1
          a = a + 53
        end
        if not rollToken then
          rollToken = function(s, r0, level, rate, burst, win, r, w)
            local base = now - now % r
            if level <= 0 then
              return base, 0, now
            end
            if r0 ~= r and r0 > 0 then
              -- Counted in other ticks: whole tokens, rounded up, on the new
              -- grid, as of the last instant the level is known to hold (the
              -- end of its old tick, or now if sooner).
              local ow = max(floor(win / r0), 1)
              level = min(floor((level + ow - 1) / ow), 2 * (burst + 1)) * w
              if base >= s then
                s = min(s + r0 - 1, base)
              end
              s = s - s % r
            end
            level = min(level, 2 * (burst + 1) * w)
            if base < s then
              -- The clock went backwards: decide at the level's instant.
              return s, level, s
            end
            local elapsed = floor((base - s) / r)
            if elapsed >= floor((level + rate - 1) / rate) then
              level = 0
            else
              level = level - elapsed * rate
            end
            return base, level, now
          end
        end
        local w = win / r
        local s0, r0, l0, exp0 = -1, 0, 0, -1
        if v and #v == 27 and byte(v, 1) == 84 then
          local _
          _, exp0, s0, r0, l0 = unpack('<Bi6i6i6d', v)
          if exp0 <= now then
            -- Full again under the limit it was last charged with: forgotten,
            -- whatever the refill of this limit (as in the memory store).
            s0, r0, l0, exp0 = -1, 0, 0, -1
          end
        end
        local s, level = rollToken(s0, r0, l0, rate, burst, win, r, w)
        local ok = cost <= burst and level + cost * w <= burst * w and (wait < 0 or level <= wait * rate)
        -- The reply gives the stored expiry in place of the rolled tick, r.
        x = {ok, s, exp0, level, s0, r0, l0, cost, field, code, s0 < 0,
          exp0, rate, burst, win, w, r}
      elseif code == '1' or code == '4' then
        -- Fixed window (internal/window/fixed.go).
        local limit, cost, win, b0, b1, b2, b3
        if code == '1' then
          limit, win, cost = unpack('<i8i8i8', req, a + 13)
          a = a + 37
        else
          limit, cost, b0, b1, b2, b3 = unpack('<i8i8i8i8i8i8', req, a + 13)
          a = a + 61
        end
        local s0, e0, c0 = -1, 0, 0
        if v and #v == 21 and byte(v, 1) == 70 then
          local _
          _, e0, s0, c0 = unpack('<Bi6i6d', v)
        end
        local s, e, c = s0, e0, c0
        if c0 == 0 or now >= s0 then
          -- The window that contains now (unless the clock went backwards
          -- into an earlier window than the count's, which is kept).
          local ws, we
          if code == '1' then
            ws = now - now % win
            we = ws + win
          elseif now >= b1 and now < b2 then
            ws, we = b1, b2
          elseif now >= b2 and now < b3 then
            ws, we = b2, b3
          elseif now >= b0 and now < b1 then
            ws, we = b0, b1
          else
            -- Nothing was written yet.
            fail = redis.error_reply(string.format(
              'ERR sluice: instant %.0f lies outside the calendar periods [%.0f, %.0f) ' ..
              'worked out by the caller: its clock is more than a period away from ' ..
              'the Redis server\'s', now, b0, b3))
            break
          end
          if c0 == 0 or s0 ~= ws then
            s, e, c = ws, we, 0
          end
        end
        local ok = cost <= limit and c + cost <= limit
        x = {ok, s, 0, c, s0, 0, c0, cost, field, code, s0 < 0, e}
      elseif code == '2' then
        -- Sliding log (internal/window/log.go).
        local limit, win, cost = unpack('<i8i8i8', req, a + 13)
        a = a + 37
        local at, count, first, len, exp0 = now, 0, 12, 0, -1
        if v then
          len = #v
        end
        if len >= 21 and (len - 11) % 10 == 0 and byte(v, 1) == 76 then
          local _
          _, exp0, count = unpack('<Bi6I4', v)
          at = max(now, (unpack('<i6', v, len - 9)))
          -- Drop the entries that have left the window.
          local cut = at - win
          while first <= len - 9 do
            local t, m = unpack('<i6I4', v, first)
            if t > cut then
              break
            end
            count = count - m
            first = first + 10
          end
          if first > len or count < 0 then
            count = 0
            for p = first, len - 9, 10 do
              local _, m = unpack('<i6I4', v, p)
              count = count + m
            end
          end
        else
          v, len = nil, 0
        end
        -- The summary (window.Summarize).
        if not leaving then
          leaving = function(v, first, need)
            for p = first, #v - 9, 10 do
              local t, m = unpack('<i6I4', v, p)
              need = need - m
              if need <= 0 then
                return t
              end
            end
            return -1
          end
        end
        local oldest, newest, retryc, retry1 = 0, 0, -1, -1
        if first <= len - 9 then
          oldest, newest = unpack('<i6', v, first), unpack('<i6', v, len - 9)
        end
        local need = count + cost - limit
        if need > 0 and cost <= limit then
          retryc = leaving(v, first, need)
        end
        need = count + 1 - limit
        if need > 0 then
          retry1 = leaving(v, first, need)
        end
        local ok = cost <= limit and count + cost <= limit
        if force then
          -- The sum stops at 2^32 - 1; retry_1 is of the log charged:
          -- an entry that was there, or the settle's own.
          cost = min(cost, 4294967295 - count)
          need, retry1 = count + cost + 1 - limit, -1
          if need > 0 then
            if v then
              retry1 = leaving(v, first, need)
            end
            if retry1 < 0 then
              retry1 = at
            end
          end
        end
        x = {ok, count, oldest, newest, retryc, retry1, at, cost, field, code, exp0 < 0,
          exp0, v, first, win}
      else
        fail = redis.error_reply('ERR sluice: unknown algorithm code ' .. tostring(code))
        break
      end
      st[i] = x
      all = all and x[1]
    end

    if not fail and charge and (all or force) then
      -- One write per counter, with every cost charged to it: the first charge
      -- of a counter writes the total; link chains the others.
      local total, link = total1, noLink
      if n > 1 then
        total, link = {}, {}
      end
      if n == 1 then
        total[1] = st[1][8]
      else
        local first, last = {}, {}
        for i = 1, n do
          local id = KEYS[kb + i] .. '\0' .. st[i][9]
          local j = first[id]
          if j == nil then
            first[id] = i
            total[i] = st[i][8]
          else
            total[j] = total[j] + st[i][8]
            link[last[id]] = i
          end
          last[id] = i
        end
      end
      -- fresh[key]: the bucket did not exist before this request.
      for i = 1, n do
        local x = st[i]
        local tot = total[i]
        if tot and tot > 0 then
          local key, field, code = KEYS[kb + i], x[9], x[10]
          if x[11] then
            prune(key, field)
          end
          -- exp: the counter's new expiry, if it may extend the bucket's.
          local value, exp
          if code == '0' then
            local w = x[12]
            local n = x[4] + tot
            if n > 4503599627370496 then
              n = 4503599627370496
            end
            value = pack('<dddd', x[2], x[3], n, w)
            if x[2] ~= x[5] then
              -- A new window (or counter): it matters for the rest of it plus
              -- the next one (window.Expiry).
              exp = x[2] + 2 * w
            end
          elseif code == '3' or code == '5' then
            -- The charges of this counter in turn, each rolling the level
            -- under its own limit before adding its cost.
            local s, r, level, last
            local j = i
            while j do
              local y = st[j]
              if y[8] > 0 then
                if last then
                  s, level = rollToken(s, r, level, y[13], y[14], y[15], y[17], y[16])
                else
                  s, level = y[2], y[4]
                end
                r = y[17]
                if force then
                  level = min(level + y[8] * y[16], 2 * (y[14] + 1) * y[16])
                else
                  level = level + y[8] * y[16]
                end
                last = y
              end
              j = link[j]
            end
            -- A refill beyond year 6429 (an enormous capacity refilled very
            -- slowly) is stored as then.
            local e = min(s + floor((level + last[13] - 1) / last[13]) * r, 140737488355327)
            value = pack('<Bi6i6i6d', 84, e, s, r, level)
            -- The expiry of a bucket or a log moves on with every charge: the
            -- bucket's is rounded up to a whole number of windows, and
            -- extended only when that moves, which keeps an idle bucket at
            -- most a window longer.
            local g, e0 = x[15], x[12]
            e = e + (g - e % g) % g
            if e0 < 0 or e > e0 + (g - e0 % g) % g then
              exp = e
            end
          elseif code == '2' then
            -- The entries left in the window (from byte p of v), and the
            -- request's, merged into the newest if it has the same instant:
            -- built in one concatenation, since a log may be long.
            local at, win, v, p = x[7], x[15], x[13], x[14]
            local head = pack('<Bi6I4', 76, at + win, x[2] + tot)
            if not v or p > #v - 9 then
              value = head .. pack('<i6I4', at, tot)
            elseif x[4] == at then
              local _, m = unpack('<i6I4', v, #v - 9)
              value = head .. sub(v, p, -11) .. pack('<i6I4', at, m + tot)
            else
              value = head .. sub(v, p) .. pack('<i6I4', at, tot)
            end
            local e, e0 = at + win, x[12]
            e = e + (win - e % win) % win
            if e0 < 0 or e > e0 + (win - e0 % win) % win then
              exp = e
            end
          else
            local n = x[4] + tot
            if n > 4503599627370496 then
              n = 4503599627370496
            end
            value = pack('<Bi6i6d', 70, x[12], x[2], n)
            if x[2] ~= x[5] then
              exp = x[12]
            end
          end
          local ttl = exp and max(1, exp - now) or 0
          if lfield == field and lkey == key then
            lval, ldirty, lttl = value, true, max(lttl, ttl)
          else
            redis.call('HSET', key, field, value)
            if ttl > 0 then
              extend(key, ttl)
            end
          end
        end
      end
    end

    -- The reply, in 8-byte integers.
    if fail then
      reply = fail
    elseif n == 1 then
      local x = st[1]
      reply = pack('<i8i8i8i8i8i8i8i8i8', all and 1 or 0, now,
        x[1] and 1 or 0, x[2], x[3], x[4], x[5], x[6], x[7])
    else
      local out = {pack('<i8i8', all and 1 or 0, now)}
      for i = 1, n do
        local x = st[i]
        out[i + 1] = pack('<i8i8i8i8i8i8i8', x[1] and 1 or 0, x[2], x[3], x[4], x[5], x[6], x[7])
      end
      reply = table.concat(out)
    end
  end
  replies[q] = reply
  kb, ab = kb + n, ab + na
end

flush()
if calls == 1 then
  return replies[1]
end
return replies
