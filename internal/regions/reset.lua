--!df flags=allow-undeclared-keys
-- Resets a global counter in the region's own Redis: the current and the
-- previous window's "#reset" field becomes the regions' sum in that
-- window, which decide.lua takes off (regions.Reset). The G-counter's
-- fields never go down; "#reset" is merged like them (the largest wins),
-- so that the reset reaches the peers through the syncer.
-- KEYS[1]: the counter's key without the window ("{counter}:")
-- ARGV: now (ms; -1 for the server's clock, TIME), w (ms)
-- Reply: start, now, the current window's mark, the previous one's
-- Like decide.lua, it names the windows' hashes from KEYS[1] by the
-- server's clock (same hash tag, not in KEYS: see the first line).
local now = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
if now < 0 then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local start = now - now % w
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
return {start, now, mark(KEYS[1] .. start), mark(KEYS[1] .. (start - w))}
