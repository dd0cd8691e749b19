-- Resets a global counter in the region's own Redis: the current and the
-- previous window's "#reset" field becomes the regions' sum in that
-- window, which decide.lua takes off (regions.Reset). The G-counter's
-- fields never go down; "#reset" is merged like them (the largest wins),
-- so that the reset reaches the peers through the syncer.
-- KEYS: the hashes of the counter's windows that the caller expects the
--   reset to need (regions.Declared, with the previous window), all with
--   the counter's hash tag
-- ARGV: now (ms; -1 for the server's clock, TIME), w (ms), the counter's
--       key without the window ("{counter}:")
-- As in decide.lua, now picks the window, and the script touches only
-- keys in KEYS: if the current or the previous window's hash is not
-- there, it touches nothing and replies -1, now.
-- Reply: start, now, the current window's mark, the previous one's; or
-- -1, now
local now = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local start = now - now % w
local curr = ARGV[3] .. start
local prev = ARGV[3] .. (start - w)
local declared = {}
for _, k in ipairs(KEYS) do
  declared[k] = true
end
if not declared[curr] or not declared[prev] then
  return {-1, now}
end
local function mark(key)
  local kv = redis.call("HGETALL", key)
  local s, reset = 0, 0
  for i = 1, #kv, 2 do
    local n = tonumber(kv[i + 1])
    if kv[i] == "#reset" then
      reset = n
    else
      s = s + n
    end
  end
  if s > reset then
    -- The hash exists, with the expiry decide.lua or merge.lua gave it.
    redis.call("HSET", key, "#reset", s)
    return s
  end
  return reset
end
return {start, now, mark(curr), mark(prev)}
