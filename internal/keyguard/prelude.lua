local __keyguard_declared = {}
for _, k in ipairs(KEYS) do __keyguard_declared[k] = true end
local __keyguard_specs = {SPECS}
local __keyguard_redis = redis
local function __keyguard_key(cmd, k)
  if not __keyguard_declared[k] then
    error('sluice keyguard: ' .. cmd .. ' touches key ' .. string.format('%q', tostring(k)) .. ', which is not in KEYS', 0)
  end
end
local function __keyguard_check(name, ...)
  local cmd = type(name) == 'string' and string.upper(name) or tostring(name)
  local spec = __keyguard_specs[cmd]
  if spec == nil then
    error('sluice keyguard: command ' .. cmd .. ' has no entry in the table of internal/keyguard, which must say where its keys are', 0)
  end
  if spec == 'first' then
    __keyguard_key(cmd, (select(1, ...)))
  elseif spec == 'all' then
    for i = 1, select('#', ...) do __keyguard_key(cmd, (select(i, ...))) end
  end
end
local redis = setmetatable({
  call = function(...) __keyguard_check(...) return __keyguard_redis.call(...) end,
  pcall = function(...) __keyguard_check(...) return __keyguard_redis.pcall(...) end
}, {__index = __keyguard_redis})
