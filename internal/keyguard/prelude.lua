local __keyguard_declared, __keyguard_tags = {}, {}
local function __keyguard_tag(k)
  local s = string.find(k, '{', 1, true)
  if s then
    local e = string.find(k, '}', s + 1, true)
    if e and e > s + 1 then return string.sub(k, s + 1, e - 1) end
  end
  return k
end
for _, k in ipairs(KEYS) do __keyguard_declared[k] = true __keyguard_tags[__keyguard_tag(k)] = true end
local __keyguard_specs = {SPECS}
local __keyguard_redis = redis
local function __keyguard_key(cmd, k)
  k = tostring(k)
  if __keyguard_declared[k] then return end
  if UNDECLARED and __keyguard_tags[__keyguard_tag(k)] then return end
  error('sluice keyguard: ' .. cmd .. ' touches key ' .. string.format('%q', k) .. ', which is not in KEYS' .. (UNDECLARED and ' nor in the hash slot of a key in KEYS' or ''), 0)
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
