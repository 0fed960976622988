-- The renewal of a holder kept as a string, or as a member of a sorted set of holders scored
-- by their lease deadlines in server milliseconds: a read-write lock's writer or reader
-- (rw_write.lua describes its keys and values), or a semaphore's holder (sem_permits.lua).
--
-- KEYS     the hold's key (W for the writer, R for a reader, the semaphore's key)
-- ARGV[1]  'write': the hold is a string only (the writer); another word ('read', 'permits'):
--          a string or a member of the sorted set
-- ARGV[2]  'GEN|': the hold's acquisition
-- ARGV[3]  lease in ms
-- Returns 1 extended, 0 not held.

local lease = tonumber(ARGV[3])
local v, ty = string_at(KEYS[1])
if v then
  -- A string hold: renewed when it is the acquisition's (the value starts with it).
  if starts(v, ARGV[2]) then
    redis.call('pexpire', KEYS[1], lease)
    return 1
  end
  return 0
end
if ARGV[1] == 'write' or ty ~= 'zset' then
  return 0
end
local now = ms_of(redis.call('time'))
local m, s = find_reader(KEYS[1], ARGV[2])
if m and s > now then
  redis.call('zadd', KEYS[1], now + lease, m)
  extend(KEYS[1], lease)
  return 1
end
return 0
