-- What an operator does to a Mutex whoever holds it: read it, or free it by force. Not on any
-- holder's path. See acquire.lua for the value.
--
-- KEYS[1]  the lock
-- KEYS[2]  the release channel (and the release marker's key, which this never writes)
-- ARGV[1]  'holder': read the lock; 'force': free it
--
-- Returns {1, value, pttl, s, us}   held: its value, its lease left, and the server clock
--         {2, owner, count, token, pttl, s, us}
--                                   held by a client of the layout before this one (a hash)
--         {0}                       free (no key, or a tombstone)
--         {-1}                      the key is not a locksmith lock; nothing changed
-- and 'force' frees a lock it found held (as it was before: the reply says what was freed).
--
-- Freeing by force deletes the value; it does not move it to the release marker, so that the
-- dispossessed holder's own release (even a retried one) is told of its loss, never that it
-- released. Tokens keep rising: when the holder's hand-off block reaches beyond what the next
-- grant's token would be (the clock + LEAD), a tombstone of its last token is left instead, as
-- release.lua leaves one. The release is published, so that waiters try at once.

local t = redis.call('time')
local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then
  if old_layout(KEYS[1]) then
    local f = redis.call('hmget', KEYS[1], 'owner', 'count', 'token')
    local out = {2, f[1], f[2] or '1', f[3] or '0', redis.call('pttl', KEYS[1]), t[1], t[2]}
    if ARGV[1] == 'force' then
      redis.call('publish', KEYS[2], 'released')
      redis.call('del', KEYS[1])
    end
    return out
  end
  return {-1}
end
if not v or string.byte(v, 1) == TOMB then
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
local token = s * 1000000 + us + LEAD
if #f == 9 and f[9] ~= '' then
  token = tonumber(f[9]) or token
end
redis.call('publish', KEYS[2], 'released')
if not tombstone(KEYS[1], token + b, t) then
  redis.call('del', KEYS[1])
end
return out
