-- The read-write lock: one writer, or many readers, each holder a lease of its own. Atomic,
-- one round trip per operation. Re-entry is counted by the client (one server entry per
-- acquisition), so every call here concerns one acquisition.
--
-- KEYS[1]  writer: a hash (owner, gen, token, prev), expiring with the writer's lease
-- KEYS[2]  fencing counter (a plain integer, expiring FENCE_TTL_MS after its last write)
-- KEYS[3]  readers: a sorted set, acquisition id -> lease deadline (server ms)
-- KEYS[4]  waiting writers: a sorted set, acquisition id -> deadline of the wait (server ms)
-- KEYS[5]  waiting readers that defer to waiting writers: as KEYS[4]
-- KEYS[6]  waiting readers that do not defer: as KEYS[4]
-- KEYS[7]  release_read only: the release marker of the caller's acquisition (see there)
-- ARGV[1]  operation: 'write', 'read', 'reenter', 'release_write', 'release_read', 'renew',
--          'cancel'
-- ARGV[2]  owner id (client UUID and thread id)
-- ARGV[3]  acquisition id (request id of the acquire call); id = owner .. '/' .. acquisition
-- ARGV[4]  lease in milliseconds (also how long a waiter's registration lasts unrefreshed)
-- ARGV[5]  readers' channel: published when the lock becomes open to readers (wakes them all)
-- ARGV[6]  writers' channel: published when the lock becomes free and a writer waits
--
-- write    ARGV[7] '1' to register as a waiting writer when not granted
--          Returns {1, token, 1, gen} held (gen = ARGV[3], the acquisition), {0, wait_ms}
--          not held, {-1} foreign keys
-- read     ARGV[7] '1': defer to waiting writers (writer preference); ARGV[8] '1' to register
--          Returns {1, 0, 1, gen} held (gen = ARGV[3]), {0, wait_ms} not held, {-1} foreign
-- reenter  A nested level of the caller's hold, whose acquisition is ARGV[3]: ARGV[7] 'write'
--          for its write lock, 'read' for its read lock; ARGV[8] the lease in milliseconds the
--          hold must have left afterwards (only ever moved later; '0' leaves it as it is).
--          Returns 1 when that acquisition still holds (re-entry is counted by the client), 0
--          when it does not any more (expired, deleted, lost in a restart): nothing changed,
--          and nothing is recreated for it.
-- release_write
--          ARGV[7] only on the retry of a release whose first attempt failed on the connection:
--                  the caller's fencing token ('' or absent otherwise)
--          Returns 0 released, -1 not held (lease ran out), -2 another acquisition holds the
--          writer hash, -3 foreign keys, -4 (a retry) released by the first attempt: the
--          writer hash is gone and the counter still stands at ARGV[7], or the writer now was
--          granted it with the counter there ('prev'); see release.lua
-- release_read
--          ARGV[7] '1' on the retry of a release whose first attempt failed on the connection
--          ARGV[8] how long the release marker lives, in milliseconds: a release writes
--                  KEYS[7], so that its retry tells "my first attempt released it" from "it
--                  was gone" (readers have no token for the fencing counter to tell it by)
--          Returns 0 released (a retry: by the first attempt), -1 not held (lease ran out,
--          or Redis lost it), -3 foreign keys
-- renew    Returns 1 extended, 0 not held.
-- cancel   Removes the caller from the waiting sets (a waiter that gives up). Returns 0.
--
-- Time is the server's clock (TIME). Expired readers and waiters are dropped by every call.

local now_t = redis.call('time')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local op, owner, gen, lease = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local me = owner .. '/' .. gen

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000
-- See acquire.lua: how far ahead of the clock a counter that was gone starts.
local SEED_LEAD_US = 1000000 + 1024

local function foreign()
  if op == 'write' or op == 'read' then
    return {-1}
  end
  if op == 'release_write' or op == 'release_read' then
    return -3
  end
  return 0
end
local wt = redis.call('type', KEYS[1])['ok']
if wt ~= 'none' and wt ~= 'hash' then
  return foreign()
end
for i = 3, 6 do
  local t = redis.call('type', KEYS[i])['ok']
  if t ~= 'none' and t ~= 'zset' then
    return foreign()
  end
end
local w = {false, false, false, false}
if wt == 'hash' then
  w = redis.call('hmget', KEYS[1], 'owner', 'gen', 'token', 'prev')
  if w[1] == false then
    return foreign()
  end
end

-- Drop expired readers and waiters.
for i = 3, 6 do
  redis.call('zremrangebyscore', KEYS[i], '-inf', now)
end

-- Records `id` in the sorted set `key` until `lease` ms from now, and moves the key's expiry
-- to at least that; never earlier. Holders and waiters may have leases of different lengths
-- (clients with different settings): a short one must not make the set, and with it a longer
-- reader's lease, expire early.
local function touch(key, id)
  redis.call('zadd', key, now + lease, id)
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
end

local function first_deadline(key)
  local f = redis.call('zrange', key, 0, 0, 'withscores')
  if f[2] then
    return math.max(tonumber(f[2]) - now, 1)
  end
  return nil
end

-- After a release: wake whoever can now proceed. Free with a writer waiting: the writers;
-- open to readers (no writer): the readers, unless every waiting reader defers to a waiting
-- writer.
local function wake()
  if redis.call('exists', KEYS[1]) == 1 then
    return
  end
  local writers = redis.call('zcard', KEYS[4])
  local readers = redis.call('zcard', KEYS[3])
  if readers == 0 and writers > 0 then
    redis.call('publish', ARGV[6], 'free')
  end
  local eager = redis.call('zcard', KEYS[6])
  local deferring = redis.call('zcard', KEYS[5])
  if eager > 0 or (deferring > 0 and writers == 0) then
    redis.call('publish', ARGV[5], 'open')
  end
end

if op == 'write' then
  if w[1] == owner and w[2] == gen then
    -- A retry of this very call.
    redis.call('pexpire', KEYS[1], lease)
    return {1, w[3], 1, gen}
  end
  local wait = nil
  if wt == 'hash' and w[1] ~= owner then
    wait = redis.call('pttl', KEYS[1])
  elseif wt == 'none' then
    -- Readers other than this thread's own read levels keep a writer out.
    local others = 0
    for _, r in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
      if string.sub(r, 1, #owner + 1) ~= owner .. '/' then
        others = others + 1
      end
    end
    if others > 0 then
      wait = first_deadline(KEYS[3]) or 1
    end
  end
  -- Free, or held by an earlier acquisition of this very thread that it no longer knows of
  -- (a release whose reply was lost): a new acquisition replaces it, as the plain mutex does.
  if wait == nil then
    -- The token by acquire.lua's rule (see there): the larger of the counter + 1 and the
    -- server clock in microseconds, or the clock + SEED_LEAD_US when the counter is gone.
    -- 'prev' keeps the counter as found, for a retried release of the writer before.
    local found = redis.call('get', KEYS[2])
    local micros = tonumber(now_t[1]) * 1000000 + tonumber(now_t[2])
    local first = micros + SEED_LEAD_US
    if found then
      first = math.max((tonumber(found) or 0) + 1, micros)
    end
    local token = string.format('%.0f', first)
    redis.call('set', KEYS[2], token, 'px', FENCE_TTL_MS)
    redis.call('del', KEYS[1])
    redis.call('hset', KEYS[1], 'owner', owner, 'gen', gen, 'token', token, 'prev', found or '')
    redis.call('pexpire', KEYS[1], lease)
    redis.call('zrem', KEYS[4], me)
    return {1, token, 1, gen}
  end
  if ARGV[7] == '1' then
    touch(KEYS[4], me)
  end
  return {0, wait}
end

if op == 'read' then
  if redis.call('zscore', KEYS[3], me) then
    -- A retry of this very call.
    touch(KEYS[3], me)
    return {1, 0, 1, gen}
  end
  local wait = nil
  if wt == 'hash' and w[1] ~= owner then
    wait = redis.call('pttl', KEYS[1])
    if ARGV[7] == '1' then
      -- After the writer's release, a waiting writer that died keeps this reader out until
      -- its own deadline, and no message comes then: wake by that deadline too.
      wait = math.min(wait, first_deadline(KEYS[4]) or wait)
    end
  elseif wt == 'none' and ARGV[7] == '1' then
    wait = first_deadline(KEYS[4])
  end
  if wait == nil then
    touch(KEYS[3], me)
    redis.call('zrem', KEYS[5], me)
    redis.call('zrem', KEYS[6], me)
    return {1, 0, 1, gen}
  end
  if ARGV[8] == '1' then
    if ARGV[7] == '1' then
      touch(KEYS[5], me)
    else
      touch(KEYS[6], me)
    end
  end
  return {0, wait}
end

if op == 'release_write' then
  local retry = ARGV[7] ~= nil and ARGV[7] ~= ''
  local function last_was_mine(counter)
    return retry and counter ~= false and counter ~= '' and tonumber(counter) == tonumber(ARGV[7])
  end
  if wt == 'none' then
    local freed = last_was_mine(redis.call('get', KEYS[2]))
    wake()
    if freed then
      return -4
    end
    return -1
  end
  if w[1] ~= owner or w[2] ~= gen then
    if last_was_mine(w[4]) then
      return -4
    end
    return -2
  end
  redis.call('del', KEYS[1])
  wake()
  return 0
end

if op == 'release_read' then
  if redis.call('zrem', KEYS[3], me) == 0 then
    wake()
    if ARGV[7] == '1' and redis.call('exists', KEYS[7]) == 1 then
      return 0
    end
    return -1
  end
  redis.call('set', KEYS[7], '1', 'px', tonumber(ARGV[8]) or 1)
  wake()
  return 0
end

if op == 'renew' then
  if w[1] == owner and w[2] == gen then
    redis.call('pexpire', KEYS[1], lease)
    return 1
  end
  if redis.call('zscore', KEYS[3], me) then
    touch(KEYS[3], me)
    return 1
  end
  return 0
end

if op == 'reenter' then
  local ms = tonumber(ARGV[8]) or 0
  if ARGV[7] == 'write' then
    if w[1] ~= owner or w[2] ~= gen then
      return 0
    end
    if ms > 0 and redis.call('pttl', KEYS[1]) < ms then
      redis.call('pexpire', KEYS[1], ms)
    end
    return 1
  end
  local score = redis.call('zscore', KEYS[3], me)
  if not score then
    return 0
  end
  if ms > 0 and tonumber(score) < now + ms then
    redis.call('zadd', KEYS[3], now + ms, me)
  end
  if ms > 0 and redis.call('pttl', KEYS[3]) < ms then
    redis.call('pexpire', KEYS[3], ms)
  end
  return 1
end

if op == 'cancel' then
  local was_writer = redis.call('zrem', KEYS[4], me)
  redis.call('zrem', KEYS[5], me)
  redis.call('zrem', KEYS[6], me)
  if was_writer == 1 then
    -- Readers deferring to this writer may go now.
    wake()
  end
  return 0
end

return redis.error_reply('unknown read-write lock operation')
