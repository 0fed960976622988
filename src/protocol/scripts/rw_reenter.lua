-- A re-entry of a read-write lock's writer or reader (rw_write.lua describes the keys and
-- values).
--
-- KEYS     W, R
-- ARGV[1]  'write' or 'read': which hold
-- ARGV[2]  'GEN|': the hold's acquisition
-- ARGV[3]  the lease in ms the hold must have left afterwards (only ever moved later; '0'
--          leaves it)
-- Returns 1 when that acquisition still holds, 0 when it does not any more (nothing changed,
-- nothing is recreated for it).

local ms = tonumber(ARGV[3]) or 0
local key = ARGV[1] == 'read' and KEYS[2] or KEYS[1]
local v, ty = string_at(key)
if v then
  if not starts(v, ARGV[2]) then
    return 0
  end
  extend(key, ms)
  return 1
end
if key == KEYS[1] or ty ~= 'zset' then
  return 0
end
local now = ms_of(redis.call('time'))
local m, s = find_reader(KEYS[2], ARGV[2])
if not m or s <= now then
  return 0
end
if ms > 0 and s < now + ms then
  redis.call('zadd', KEYS[2], now + ms, m)
end
extend(KEYS[2], ms)
return 1
