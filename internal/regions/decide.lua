-- Decides a request of a global limit on the region's own Redis; the
-- arithmetic of regions.Start, regions.Covers, regions.Total and
-- regions.Fits.
-- KEYS: the hashes of the counter's windows (one field per region) that
--   the caller expects the decision to need (regions.Declared), all with
--   the counter's hash tag (one Cluster slot)
-- ARGV: self, cost, limit, now (ms; -1 for the server's clock, TIME),
--       w (ms), sliding (0/1), share, ttl slack (ms), the counter's key
--       without the window ("{counter}:"), stale peers...
-- The window is picked by now, so that the app servers of a region agree
-- on it whatever their own clocks: its hash is ARGV[9] .. start. The
-- script touches only keys in KEYS: if the current window's hash, or for
-- a sliding window the previous one's, is not there (the caller's
-- estimate of the server's clock was off by more than a window), it
-- touches nothing and replies -1, now; the caller then declares the
-- windows around that now and runs it again (regions.Covers).
-- A window's field "#reset" is the regions' sum at the last reset
-- (reset.lua): it is taken off the sum.
-- Reply: allowed, total, own, start, now; or -1, now
local self = ARGV[1]
local cost = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local w = tonumber(ARGV[5])
local sliding = ARGV[6] == "1"
local share = tonumber(ARGV[7])
local slack = tonumber(ARGV[8])
if now < 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local start = now - now % w
local curr = ARGV[9] .. start
local prev = ARGV[9] .. (start - w)
local declared = {}
for _, k in ipairs(KEYS) do
  declared[k] = true
end
if not declared[curr] or (sliding and not declared[prev]) then
  return {-1, now}
end

local function sum(key)
  local kv = redis.call("HGETALL", key)
  local m = {}
  local s = 0
  local reset = 0
  for i = 1, #kv, 2 do
    local n = tonumber(kv[i + 1])
    m[kv[i]] = n
    if kv[i] == "#reset" then
      reset = n
    else
      s = s + n
    end
  end
  s = math.max(0, s - reset)
  for i = 10, #ARGV do
    local n = m[ARGV[i]] or 0
    if n < share then
      s = s + share - n
    end
  end
  return s, m[self] or 0
end

local total, own = sum(curr)
if sliding then
  local p = sum(prev)
  total = total + math.floor(p * (w - (now - start)) / w)
end
if total + cost <= limit then
  if cost > 0 then
    own = redis.call("HINCRBY", curr, self, cost)
    local ttl = start + w - now + slack
    if sliding then
      ttl = ttl + w
    end
    redis.call("PEXPIRE", curr, ttl)
  end
  return {1, total + cost, own, start, now}
end
return {0, total, own, start, now}
