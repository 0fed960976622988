-- The fencing mark of a hash slot, for the lock types whose token is their grant time (the fair
-- mutex and the read-write lock's writer): this text is put before fair_mutex.lua and
-- rw_lock.lua. acquire.lua explains the mark; in short, `P{#N}:fence` holds the highest token
-- any grant of a name of that slot issued, every grant takes a token above it and raises it,
-- so tokens strictly rise per name whatever the server clock does.
--
-- A token is S * 1000000 + US + LEAD_US, where S and US are the grant time as the lock's value
-- stores it: the server clock (TIME's two fields), or, where the mark is at or above the
-- clock's token (the clock went back), the time whose token is the mark + 1.

local LEAD_US = 1001024

-- The fast path's mark: raised to `token` by one SET ... GET; when it was at or above `token`
-- already (the clock went back), it is put back and false returned: the grant then takes
-- `stamp`. Runs before the lock is written, so a refusal (an ACL) or a key of another type at
-- the mark fails the script with nothing changed.
local function raise_mark(key, token)
  local m = redis.call('set', key, token, 'get')
  if not m or (tonumber(m) or 0) < token then
    return true
  end
  redis.call('set', key, m)
  return false
end

-- The grant time of a new token, given the server clock `t` (TIME's reply) and the mark at
-- `key`; raises the mark to the token. Returns S, US (strings, as TIME gives them) and the
-- token.
local function stamp(key, t)
  local s, us = t[1], t[2]
  local token = s * 1000000 + us + LEAD_US
  local m = tonumber(redis.call('get', key) or '') or 0
  if m >= token then
    local at = m + 1 - LEAD_US
    s, us = string.format('%.0f', math.floor(at / 1000000)), string.format('%.0f', at % 1000000)
    token = m + 1
  end
  redis.call('set', key, token)
  return s, us, token
end

