local struct = (function()
  local byte, char, sub, floor, frexp, ldexp = string.byte, string.char, string.sub, math.floor, math.frexp, math.ldexp
  local sizes = {b = 1, B = 1, h = 2, H = 2, i = 4, I = 4, l = 8, L = 8}
  local function items(fmt)
    local out, i = {}, 1
    while i <= #fmt do
      local c = sub(fmt, i, i)
      i = i + 1
      local digits = string.match(fmt, '^%d+', i)
      local n
      if digits then n = tonumber(digits) i = i + #digits end
      if c == '>' then error('struct: big-endian formats are not supported here', 0) end
      if c ~= '<' and c ~= '!' and c ~= '=' and c ~= ' ' then out[#out + 1] = {c, n} end
    end
    return out
  end
  local function packint(v, size)
    v = v < 0 and -floor(-v) or floor(v)
    local neg = v < 0
    if neg then v = -v - 1 end
    local t = {}
    for k = 1, size do
      local b = v % 256
      v = (v - b) / 256
      t[k] = neg and 255 - b or b
    end
    return char(unpack(t))
  end
  local function unpackint(s, pos, size, signed)
    local bytes = {byte(s, pos, pos + size - 1)}
    if #bytes < size then error('struct: data string too short', 0) end
    local neg = signed and bytes[size] >= 128
    local v, m = 0, 1
    for k = 1, size do
      v = v + (neg and 255 - bytes[k] or bytes[k]) * m
      m = m * 256
    end
    if neg then v = -v - 1 end
    return v
  end
  local function packdouble(x)
    local sign = 0
    if x < 0 or (x == 0 and 1 / x < 0) then sign = 1 x = -x end
    local e, m
    if x ~= x then e, m = 2047, 2 ^ 51
    elseif x == math.huge then e, m = 2047, 0
    elseif x == 0 then e, m = 0, 0
    else
      local fr, ex = frexp(x)
      e = ex + 1022
      if e <= 0 then e, m = 0, ldexp(x, 1074) else m = (fr * 2 - 1) * 2 ^ 52 end
    end
    local lo = m % 2 ^ 32
    local hi = (m - lo) / 2 ^ 32 + e * 2 ^ 20 + sign * 2 ^ 31
    return packint(lo, 4) .. packint(hi, 4)
  end
  local function unpackdouble(s, pos)
    local lo, hi = unpackint(s, pos, 4, false), unpackint(s, pos + 4, 4, false)
    local sign = hi >= 2 ^ 31 and -1 or 1
    hi = hi % 2 ^ 31
    local e = floor(hi / 2 ^ 20)
    local m = (hi % 2 ^ 20) * 2 ^ 32 + lo
    if e == 0 then return sign * ldexp(m, -1074) end
    if e == 2047 then return m == 0 and sign * math.huge or 0 / 0 end
    return sign * ldexp(m + 2 ^ 52, e - 1075)
  end
  local function pack(fmt, ...)
    local out, a = {}, 1
    for _, it in ipairs(items(fmt)) do
      local c, n = it[1], it[2]
      local v = select(a, ...)
      a = a + 1
      if c == 'd' then out[#out + 1] = packdouble(v)
      elseif c == 'c' then
        v = tostring(v)
        n = n or #v
        out[#out + 1] = sub(v, 1, n) .. string.rep('\0', n - #v)
      else
        local size = n or sizes[c]
        if size == nil then error('struct: unsupported format ' .. c, 0) end
        out[#out + 1] = packint(v, size)
      end
    end
    return table.concat(out)
  end
  local function unpack_(fmt, s, init)
    local out, pos = {}, init or 1
    for _, it in ipairs(items(fmt)) do
      local c, n = it[1], it[2]
      if c == 'd' then
        out[#out + 1] = unpackdouble(s, pos)
        pos = pos + 8
      elseif c == 'c' then
        if pos + n - 1 > #s then error('struct: data string too short', 0) end
        out[#out + 1] = sub(s, pos, pos + n - 1)
        pos = pos + n
      else
        local size = n or sizes[c]
        if size == nil then error('struct: unsupported format ' .. c, 0) end
        out[#out + 1] = unpackint(s, pos, size, c == string.lower(c))
        pos = pos + size
      end
    end
    out[#out + 1] = pos
    return unpack(out)
  end
  return {pack = pack, unpack = unpack_}
end)()
