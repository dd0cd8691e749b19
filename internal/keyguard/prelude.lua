local __keyguard_declared = {}
for _, k in ipairs(KEYS) do __keyguard_declared[k] = true end
local __keyguard_specs = {SPECS}
local __keyguard_redis = redis
local __keyguard_rcall, __keyguard_rpcall = redis.call, redis.pcall
local __keyguard_tags
local function __keyguard_tag(k)
  local s = string.find(k, '{', 1, true)
  if s then
    local e = string.find(k, '}', s + 1, true)
    if e and e > s + 1 then return string.sub(k, s + 1, e - 1) end
  end
  return k
end
local function __keyguard_key(cmd, k)
  k = tostring(k)
  if __keyguard_declared[k] then return end
  if UNDECLARED then
    if not __keyguard_tags then
      __keyguard_tags = {}
      for _, d in ipairs(KEYS) do __keyguard_tags[__keyguard_tag(d)] = true end
    end
    if __keyguard_tags[__keyguard_tag(k)] then return end
  end
  error('sluice keyguard: ' .. string.upper(tostring(cmd)) .. ' touches key ' .. string.format('%q', k) .. ', which is not in KEYS' .. (UNDECLARED and ' nor in the hash slot of a key in KEYS' or ''), 0)
end
local function __keyguard_check(cmd, k, ...)
  local spec = __keyguard_specs[cmd]
  if spec == nil then
    spec = __keyguard_specs[type(cmd) == 'string' and string.upper(cmd) or '']
    if spec == nil then
      error('sluice keyguard: command ' .. tostring(cmd) .. ' has no entry in the table of internal/keyguard, which must say where its keys are', 0)
    end
  end
  if spec == 'first' then
    if not __keyguard_declared[k] then __keyguard_key(cmd, k) end
  elseif spec == 'all' then
    __keyguard_key(cmd, k)
    for i = 1, select('#', ...) do __keyguard_key(cmd, (select(i, ...))) end
  end
end
local redis = setmetatable({
  call = function(...) __keyguard_check(...) return __keyguard_rcall(...) end,
  pcall = function(...) __keyguard_check(...) return __keyguard_rpcall(...) end
}, {__index = __keyguard_redis})
