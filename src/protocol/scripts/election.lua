-- An election (see src/locks/mutex/election.rs): its leadership is a Mutex on the election's
-- own keys, whose scripts (acquire.lua, release.lua, renew.lua) take, end and renew it. This
-- script does what only an election does: announce a leader, proclaim its value, and read the
-- leader with its value.
--
-- KEYS[1]  the election's lock (a Mutex value: see acquire.lua)
-- KEYS[2]  the leader's value: 'GEN|VALUE', the acquisition that proclaimed it and the value
-- KEYS[3]  the election's channel: its releases, announcements and proclamations
-- ARGV[1]  'announce', 'proclaim' or 'leader'
-- ARGV[2]  'announce', 'proclaim': the leader's acquisition (its GEN)
-- ARGV[3]  'proclaim': the value
--
-- 'announce': the acquisition holds the lock: a value left by an earlier leader is deleted, and
--             'elected' is published. Returns 1; 0 when it does not hold the lock (nothing
--             changed); -1 when the lock's key is not a locksmith lock.
-- 'proclaim': the acquisition holds the lock: the value is stored and 'proclaimed' published.
--             Returns 1, 0 or -1 as 'announce'.
-- 'leader':   Returns {1, value, pttl, s, us, leader_value or false} when held (as
--             mutex_admin.lua's 'holder'), {0} when free, {-1} for a key of another kind.

local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then
  if ARGV[1] == 'leader' then
    return {-1}
  end
  return -1
end
if ARGV[1] == 'leader' then
  if not v then
    return {0}
  end
  local t = redis.call('time')
  local said = redis.pcall('get', KEYS[2])
  if type(said) ~= 'string' then
    said = false
  end
  return {1, v, redis.call('pttl', KEYS[1]), t[1], t[2], said}
end
local gen = ARGV[2] .. '|'
if not v or string.sub(v, 1, #gen) ~= gen then
  return 0
end
if ARGV[1] == 'announce' then
  local said = redis.pcall('get', KEYS[2])
  if type(said) ~= 'string' or string.sub(said, 1, #gen) ~= gen then
    redis.call('del', KEYS[2])
  end
  redis.call('publish', KEYS[3], 'elected')
  return 1
end
if ARGV[1] == 'proclaim' then
  redis.call('set', KEYS[2], gen .. ARGV[3])
  redis.call('publish', KEYS[3], 'proclaimed')
  return 1
end
return redis.error_reply('ERR election: unknown operation')
