-- The read-write lock's read acquire (rw_write.lua describes the keys and values).
--
-- KEYS     W, R, WW (and WR, WE with ARGV[4])
-- ARGV[1]  'defer': defer to waiting writers (writer preference); 'eager': do not
-- ARGV[2]  'GEN|OWNER'
-- ARGV[3]  lease in ms
-- ARGV[4]  '1' to register as a waiting reader when not granted (and to leave the
--          registration when granted)
-- Returns 1 or {1, 0, 1, GEN} held, {0, wait_ms} not held, {-1} foreign keys.

local t = redis.call('time')
if ARGV[4] ~= '1' and redis.call('exists', KEYS[1], KEYS[3]) == 0
    and redis.call('set', KEYS[2], ARGV[2] .. '|' .. t[1] .. '|' .. t[2], 'nx', 'px', ARGV[3]) then
  return 1
end
-- @helpers

local now, lease = ms_of(t), tonumber(ARGV[3])
local gen, owner = string.match(ARGV[2], '^([^|]*)|(.*)$')
local me = owner .. '/' .. gen
local defer, register = ARGV[1] == 'defer', ARGV[4] == '1'
local mine = ARGV[2] .. '|' .. t[1] .. '|' .. t[2]
if not zsets(3, register and 5 or 3) then
  return {-1}
end
local ok, w, wait = writer_in_way(owner, defer and 'd' or 'e', register)
if not ok then
  return {-1}
end
local writers, first = waiting(KEYS[3], now)
if defer and first and (wait or not w) then
  -- After the writer's release, a waiting writer that died keeps this reader out until its
  -- own deadline, and no message comes then: wake by that deadline too. (A thread that
  -- holds the write lock reads past waiting writers: a downgrade.)
  wait = math.min(wait or first, first)
end
if wait then
  if register then
    touch(defer and KEYS[4] or KEYS[5], me, now, lease)
  end
  return {0, math.max(wait, 1)}
end
local r, rty = string_at(KEYS[2])
local wflag = writers > 0
if r == false then
  if wflag then
    mine = mine .. '|w'
  end
  redis.call('set', KEYS[2], mine, 'px', lease)
elseif r then
  if not rw_parse(r) then
    return {-1}
  end
  local p = redis.call('pttl', KEYS[2])
  if starts(r, gen .. '|') then
    -- A retry of this very call.
    extend(KEYS[2], lease)
    return {1, 0, 1, gen}
  end
  -- A second reader: the string becomes a sorted set of both.
  local held, flagged = r, string.byte(r, -1) == FLAG_W
  if flagged then
    held = string.sub(r, 1, -3)
  end
  redis.call('del', KEYS[2])
  redis.call('zadd', KEYS[2], now + p, held, now + lease, mine)
  if flagged or wflag then
    redis.call('zadd', KEYS[2], '+inf', 'w')
  end
  redis.call('pexpireat', KEYS[2], now + math.max(p, lease))
else
  if rty ~= 'zset' then
    return {-1}
  end
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  local m = find_reader(KEYS[2], gen .. '|')
  if m then
    -- A retry of this very call.
    redis.call('zadd', KEYS[2], 'gt', now + lease, m)
    extend(KEYS[2], lease)
    return {1, 0, 1, gen}
  end
  redis.call('zadd', KEYS[2], now + lease, mine)
  if wflag then
    redis.call('zadd', KEYS[2], '+inf', 'w')
  end
  extend(KEYS[2], lease)
end
if register then
  redis.call('zrem', KEYS[4], me)
  redis.call('zrem', KEYS[5], me)
end
return {1, 0, 1, gen}
