-- Helpers of every lock type's scripts. Each item below (its comment, its `local` line, and
-- its body, without a blank line inside) is put into a script only when the script names it
-- (src/protocol/lua.rs).

-- Whether `s` begins with `prefix`.
local function starts(s, prefix)
  return string.sub(s, 1, #prefix) == prefix
end

-- The server clock in milliseconds, from TIME's reply `t`.
local function ms_of(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Moves the expiry of `key` to at least `ms` milliseconds from now; never earlier. '0', 0 or
-- nil leaves it.
local function extend(key, ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', key) < ms then
    redis.call('pexpire', key, ms)
  end
end

-- Appends to `out` the values of a flat list `{value, lease left, ...}`: the holders a force
-- removed, as it returns them.
local function values_of(list, out)
  for i = 1, #list, 2 do
    out[#out + 1] = list[i]
  end
  return out
end
