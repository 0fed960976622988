-- Release a lock held by this owner: its outermost level frees it, an inner level counts
-- down. One round trip, atomic.
--
-- KEYS[1]  lock hash
-- KEYS[2]  fencing counter
-- ARGV[1]  owner id
-- ARGV[2]  release channel: a message is published there when the lock is free afterwards,
--          unless it is empty (a quorum acquire undoing a partial grant: its own waiters must
--          not be woken by it, and nobody else waits for it)
-- ARGV[3]  request id: unique per release call, the same on a retry of that call, so a retry
--          after a lost reply does not release two levels
-- ARGV[4]  the holder's fencing token: the counter is raised to it, so that on a quorum of
--          masters the next token exceeds this one even where this master's counter was behind;
--          '0' with a single master, whose counter is never behind
-- ARGV[5]  the acquisition the caller's guard belongs to (the lock's 'gen')
-- ARGV[6]  '1' when the caller still holds other levels of this acquisition (an inner guard):
--          one level is counted down, and the lock is never freed by it. Otherwise (the
--          holder's outermost level) the lock is freed whatever the count says: levels the
--          server counts beyond the holder's own (an inner release that never arrived, a
--          re-entry whose reply was lost) must not keep it
-- ARGV[7]  only on the retry of an outermost release whose first attempt failed on the
--          connection (it may have run, its reply lost): the last token the caller's
--          acquisition reserved (its own token when it reserved none). Absent or '' otherwise
--
-- Returns {0, r}   the key was deleted and the release published; r: how many subscribers
--                  received the message (PUBLISH's count), so that a client whose own
--                  threads wait can tell whether others listen too
--         n >= 0  re-entry levels still held (0: the key was deleted, nothing published)
--         -1      no lock: it expired or was deleted (the lease was lost, or a retried call
--                 already released it); the lock is free, so waiters are told
--         -2      another owner (or another acquisition of this owner) holds it; nothing
--                 was changed
--         -3      the key is not a locksmith lock; nothing was changed
--         -4      (a retry, ARGV[7]) the first attempt released the lock: the key is gone and
--                 the counter still stands at ARGV[7], or the lock's owner now is the one whose
--                 grant found the counter there ('prev'). Nobody acquired the lock between the
--                 caller's acquisition and that release, and Redis did not restart empty (a
--                 grant after a restart starts above every earlier token, see acquire.lua).
--                 Anything else on a retry (-1, -2) cannot be told from a lost lease

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000

local function raise_fence()
  if ARGV[4] == '0' then
    return
  end
  local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  if last < tonumber(ARGV[4]) then
    redis.call('set', KEYS[2], ARGV[4], 'px', FENCE_TTL_MS)
  end
end
-- On a retry: whether the counter, or the grant after the caller's, says the caller's
-- acquisition was the last one before the key went.
local retry = ARGV[7] ~= nil and ARGV[7] ~= ''
local function last_was_mine(counter)
  return retry and counter ~= false and counter ~= '' and tonumber(counter) == tonumber(ARGV[7])
end

local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
  local mine = last_was_mine(redis.call('get', KEYS[2]))
  raise_fence()
  if ARGV[2] ~= '' then
    redis.call('publish', ARGV[2], 'released')
  end
  if mine then
    return -4
  end
  return -1
end
if kind ~= 'hash' then
  return -3
end
local f = redis.call('hmget', KEYS[1], 'owner', 'count', 'rel', 'gen', 'prev')
if f[1] == false then
  return -3
end
if f[1] ~= ARGV[1] or f[4] ~= ARGV[5] then
  if last_was_mine(f[5]) then
    return -4
  end
  return -2
end
if f[3] == ARGV[3] then
  return tonumber(f[2])
end
if ARGV[6] == '1' then
  local count = redis.call('hincrby', KEYS[1], 'count', -1)
  if count < 1 then
    -- The server counts fewer levels than the holder: the holder's outer levels still hold it.
    count = 1
    redis.call('hset', KEYS[1], 'count', 1)
  end
  redis.call('hset', KEYS[1], 'rel', ARGV[3])
  return count
end
-- Publish before deleting: a server that refuses PUBLISH (an ACL) then fails the script
-- before anything changed, so the error the caller sees matches the state.
local receivers = nil
if ARGV[2] ~= '' then
  receivers = redis.call('publish', ARGV[2], 'released')
end
redis.call('del', KEYS[1])
raise_fence()
if receivers == nil then
  return 0
end
return {0, receivers}
