-- Extend the lease of a lock held by this owner. Sent in pipelined batches.
--
-- KEYS[1]  lock hash
-- KEYS[2]  fencing counter
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  the holder's fencing token: the counter is raised to it (see release.lua); '0'
--          with a single master
-- ARGV[4]  the acquisition being renewed (the lock's 'gen')
--
-- Returns 1  extended
--         0  not held by ARGV[1] any more (expired, deleted, or another owner); nothing changed

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000

if redis.call('type', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
local f = redis.call('hmget', KEYS[1], 'owner', 'gen')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[4] then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
if ARGV[3] ~= '0' then
  local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  if last < tonumber(ARGV[3]) then
    redis.call('set', KEYS[2], ARGV[3], 'px', FENCE_TTL_MS)
  end
end
return 1
