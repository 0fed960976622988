-- Acquire, or re-enter, a lock. One round trip, atomic.
--
-- KEYS[1]  lock hash (fields: owner, count, token, gen, req, rel)
-- KEYS[2]  fencing counter (a plain integer that never expires)
-- ARGV[1]  owner id (client UUID and thread id)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  request id: unique per acquire call, the same on a retry of that call, so a retry
--          after a lost reply does not count a re-entry twice
-- ARGV[4]  '1' when the caller holds the lock through a live guard (a re-entry), '0' when not:
--          levels of this owner found without a live guard are orphans (a release whose reply
--          was lost), and a new acquisition replaces them instead of counting on top of them
--
-- Returns {1, token, count}  held by ARGV[1] now (count 1: newly acquired; > 1: re-entered)
--         {0, pttl}          held by another owner for pttl more milliseconds
--         {-1}               the key exists but is not a locksmith lock; nothing was changed

-- A new acquisition: owner, count 1, a new token, the lease.
local function grant()
  -- The token never goes backwards, even when Redis restarted empty and the counter is gone:
  -- it is the larger of the stored counter + 1 and the server clock in microseconds. Scripts
  -- replicate by effect, so replicas store the same value. Lua numbers are doubles, exact up
  -- to 2^53, which microseconds since 1970 stay under until the year 2255.
  local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local token = string.format('%.0f', math.max(last + 1, micros))
  redis.call('set', KEYS[2], token)
  -- 'gen' names this acquisition (its request id): a release or renewal from a guard of an
  -- earlier acquisition by the same owner must not touch this one.
  redis.call('hset', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token, 'gen', ARGV[3],
    'req', ARGV[3])
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, token, 1}
end

local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
  return grant()
end
if kind ~= 'hash' then
  return {-1}
end
local f = redis.call('hmget', KEYS[1], 'owner', 'count', 'token', 'req')
if f[1] == false then
  return {-1}
end
if f[1] ~= ARGV[1] then
  return {0, redis.call('pttl', KEYS[1])}
end
if f[4] == ARGV[3] then
  -- A retry of this very call: answer as the first time.
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, f[3], tonumber(f[2])}
end
if ARGV[4] ~= '1' then
  return grant()
end
local count = redis.call('hincrby', KEYS[1], 'count', 1)
redis.call('hset', KEYS[1], 'req', ARGV[3])
redis.call('pexpire', KEYS[1], ARGV[2])
return {1, f[3], count}
