-- What an operator does to a Mutex whoever holds it: read it, or free it by force. Not on any
-- holder's path. See acquire.lua for the value.
--
-- KEYS[1]  the lock
-- KEYS[2]  the release channel (and the release marker's key, which this never writes)
-- ARGV[1]  'holder': read the lock; 'force': free it
--
-- Returns {1, value, pttl, s, us}   held: its value, its lease left, and the server clock
--         {0}                       free
--         {-1}                      the key is not a locksmith lock; nothing changed
-- and 'force' frees a lock it found held (as it was before: the reply says what was freed).
--
-- Freeing by force deletes the value; it does not move it to the release marker, so that the
-- dispossessed holder's own release (even a retried one) is told of its loss, never that it
-- released. Tokens keep rising: the slot's fencing mark reaches the holder's token and hand-off
-- block (prelude/fence.lua). The release is published, so that waiters try at once.

local t = redis.call('time')
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then
  return {-1}
end
if not v then
  return {0}
end
-- A held value: 5 or 9 fields, maybe flagged.
local f = held_fields(v)
local b, s, us = tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
if (#f ~= 5 and #f ~= 9) or not b or not s or not us then
  return {-1}
end
local out = {1, v, redis.call('pttl', KEYS[1]), t[1], t[2]}
if ARGV[1] ~= 'force' then
  return out
end
redis.call('publish', KEYS[2], 'released')
redis.call('del', KEYS[1])
return out
