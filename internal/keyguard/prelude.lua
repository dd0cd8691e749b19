local __keyguard_declared = {}
for _, k in ipairs(KEYS) do __keyguard_declared[k] = true end
local __keyguard_specs = {SPECS}
local __keyguard_redis = redis
local __keyguard_rcall, __keyguard_rpcall = redis.call, redis.pcall
local function __keyguard_key(cmd, k)
  k = tostring(k)
  if __keyguard_declared[k] then return end
  error('sluice keyguard: ' .. string.upper(tostring(cmd)) .. ' touches key ' .. string.format('%q', k) .. ', which is not in KEYS', 0)
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
