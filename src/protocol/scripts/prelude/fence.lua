-- The fencing mark of a hash slot, for the lock types whose token is their grant time (the fair
-- mutex and the read-write lock's writer). acquire.lua explains the mark; in short,
-- `P{#N}:fence` holds the highest token any grant of a name of that slot issued, every grant
-- takes a token above it and raises it, so tokens strictly rise per name whatever the server
-- clock does.
--
-- A token is S * 1000000 + US + LEAD, where S and US are the grant time as the lock's value
-- stores it: the server clock (TIME's two fields), or, where the mark is at or above the
-- clock's token (the clock went back), the time whose token is the mark + 1.

-- The highest token a fencing mark's value `m` (GET's reply, or nil) covers: its digits, or, for
-- a function library's reservation 'S|US|X|NONCE' (see acquire.lua, "The memory"), the clock's
-- token at S, US plus X; 0 for none, or for a value of no form.
local function mark_value(m)
  if not m then
    return 0
  end
  local n = tonumber(m)
  if n then
    return n
  end
  local s, us, x = string.match(m, '^(%d+)|(%d+)|(%d+)|')
  if not s then
    return 0
  end
  return s * 1000000 + us + LEAD + x
end

-- The fast grant of a free lock at the server clock `t` (TIME's reply): the mark at `mark` is
-- raised to the clock's token by one SET ... GET, and `lock` set to 'WHO|S|US' for `lease` ms.
-- Returns the token; nil, with nothing changed, when the mark was at or above that token
-- already (the clock went back: the slow path grants above it, see `stamp`). The mark is
-- raised before the lock is written, so a refusal (an ACL) or a key of another type at the
-- mark fails the script with nothing changed.
local function fast_grant(lock, mark, who, lease, t)
  local token = t[1] * 1000000 + t[2] + LEAD
  local m = redis.call('set', mark, token, 'get')
  if mark_value(m) >= token then
    redis.call('set', mark, m)
    return nil
  end
  redis.call('set', lock, who .. '|' .. t[1] .. '|' .. t[2], 'px', lease)
  return token
end

-- The grant time of a new token, given the server clock `t` (TIME's reply) and the mark at
-- `key`; raises the mark to the token. Returns S, US (strings, as TIME gives them) and the
-- token.
local function stamp(key, t)
  local s, us = t[1], t[2]
  local token = s * 1000000 + us + LEAD
  local m = mark_value(redis.call('get', key))
  if m >= token then
    local at = m + 1 - LEAD
    s, us = string.format('%.0f', math.floor(at / 1000000)), string.format('%.0f', at % 1000000)
    token = m + 1
  end
  redis.call('set', key, token)
  return s, us, token
end
