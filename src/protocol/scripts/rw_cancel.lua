-- A waiter of a read-write lock leaves its waiting sets (a waiter that gives up; rw_write.lua
-- describes the keys).
--
-- KEYS     W, R, WW, WR, WE
-- ARGV[1]  'GEN|OWNER'
-- Returns 0.

local now = ms_of(redis.call('time'))
local gen, owner = string.match(ARGV[1], '^([^|]*)|(.*)$')
local me = owner .. '/' .. gen
if not zsets(3, 5) then
  return 0
end
local was_writer = redis.call('zrem', KEYS[3], me)
redis.call('zrem', KEYS[4], me)
redis.call('zrem', KEYS[5], me)
if was_writer == 1 then
  -- Readers deferring to this writer may go now.
  local _, wty = string_at(KEYS[1])
  local _, rty = string_at(KEYS[2])
  if wty == nil and (rty == nil or rty == 'zset') then
    wake(now)
  end
end
return 0
