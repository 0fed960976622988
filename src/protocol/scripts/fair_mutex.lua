-- The fair mutex: a lock hash plus a queue of waiters in arrival order. Atomic, one round trip
-- per operation.
--
-- KEYS[1]  lock hash (fields: owner, count, token, gen, req, rel, prev), as the plain mutex's
-- KEYS[2]  fencing counter (a plain integer, expiring FENCE_TTL_MS after its last write)
-- KEYS[3]  queue: a list of waiter ids in arrival order (id = owner .. '/' .. acquisition)
-- KEYS[4]  waiters: a hash, waiter id -> heartbeat deadline in server milliseconds
-- ARGV[1]  operation: 'acquire', 'release', 'renew' or 'cancel'
-- ARGV[2]  owner id (client UUID and thread id)
-- ARGV[3]  acquire: the request id of the call, unique per call (a new acquisition, and a
--          waiter's place in the queue, are named after it: the lock's 'gen'); release, renew
--          and cancel: the acquisition ('gen') of the caller's hold or place
-- ARGV[4]  lease in milliseconds (also the heartbeat lease of a queued waiter)
-- ARGV[5]  grant channel prefix: a grant is published on prefix .. waiter id, with the new
--          fencing token as the message
--
-- acquire  ARGV[6] the acquisition ('gen') of the caller's live hold on this lock (a
--                  re-entry), or '' when it holds none. Levels of this owner under any other
--                  acquisition are orphans and are replaced, as in acquire.lua
--          ARGV[7] '1' to join the queue (or refresh its place) when the lock is not granted
--          ARGV[8] for a re-entry: the lease in milliseconds the key must have left afterwards
--                  (only ever moved later; '0' leaves the expiry as it is)
--          Returns {1, token, count, gen}  held under acquisition gen (count 1 and gen =
--                                          ARGV[3]: new, or granted to this waiter earlier;
--                                          otherwise re-entered)
--                  {0, wait}               not held; the caller is queued when ARGV[7] is '1'.
--                                          wait: milliseconds until the lock may be free
--                                          without a message: the holder's TTL, or sooner
--                                          the heartbeat deadline of a waiter ahead (a grant
--                                          to it ends there if it died)
--                  {-1}                    the key is not a locksmith lock; nothing changed
-- release  ARGV[6] request id of the release call (a retry releases nothing twice)
--          ARGV[7] the holder's fencing token (the counter is raised to it; '0': no need)
--          ARGV[8] '1' for an inner level (counted down, never frees the lock); otherwise the
--                  holder's outermost level, which frees the lock whatever the count says
--          ARGV[9] only on the retry of an outermost release whose first attempt failed on
--                  the connection: the caller's fencing token ('' or absent otherwise)
--          Returns as release.lua: n >= 0 levels left, -1 gone, -2 another owner, -3 foreign,
--          -4 (a retry) released by the first attempt: the key is gone and the counter still
--          stands at ARGV[9], or its owner now was granted it with the counter there ('prev').
--          At zero the lock is granted to the first live waiter, who is told on its channel.
-- renew    ARGV[6] the fencing token, as for release
--          Returns 1 when the caller's lock or its place in the queue was extended, else 0.
-- cancel   Leaves the queue. Returns {1, token, count, gen} when the lock was granted to the
--          caller before it left (it holds it), {0, 0} when not.
--
-- Time is the server's clock (TIME): a waiter's heartbeat deadline is never a client's clock.

local now_t = redis.call('time')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local owner, gen, lease = ARGV[2], ARGV[3], tonumber(ARGV[4])
local me = owner .. '/' .. gen

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000

-- Moves the lock's expiry to at least ms milliseconds from now; never earlier.
local function extend(ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', KEYS[1]) < ms then
    redis.call('pexpire', KEYS[1], ms)
  end
end

-- A new fencing token, by acquire.lua's rule (see there): the larger of the counter + 1 and
-- the server clock in microseconds, or the clock + SEED_LEAD_US when the counter is gone.
-- Also returns the counter as found ('' when gone), for the grant's 'prev'.
local SEED_LEAD_US = 1000000 + 1024
local function new_token()
  local found = redis.call('get', KEYS[2])
  local micros = tonumber(now_t[1]) * 1000000 + tonumber(now_t[2])
  local first = micros + SEED_LEAD_US
  if found then
    first = math.max((tonumber(found) or 0) + 1, micros)
  end
  local token = string.format('%.0f', first)
  redis.call('set', KEYS[2], token, 'px', FENCE_TTL_MS)
  return token, found or ''
end

local function raise_fence(token)
  if token == '0' then
    return
  end
  local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  if last < tonumber(token) then
    redis.call('set', KEYS[2], token, 'px', FENCE_TTL_MS)
  end
end

-- Grants the lock to who_owner's acquisition who_gen for ttl ms, under a new token (or the
-- one given, with the counter as its maker found it).
local function take(who_owner, who_gen, ttl, token, prev)
  if not token then
    token, prev = new_token()
  end
  redis.call('del', KEYS[1])
  redis.call('hset', KEYS[1], 'owner', who_owner, 'count', 1, 'token', token, 'gen', who_gen,
    'req', who_gen, 'prev', prev)
  redis.call('pexpire', KEYS[1], ttl)
  return token
end

-- Drops dead waiters (heartbeat deadline passed) from the head of the queue. Returns the first
-- live waiter and its heartbeat deadline, or nil.
local function live_head()
  while true do
    local head = redis.call('lindex', KEYS[3], 0)
    if not head then
      return nil, 0
    end
    local dl = tonumber(redis.call('hget', KEYS[4], head) or '0') or 0
    if dl > now then
      return head, dl
    end
    redis.call('lpop', KEYS[3])
    redis.call('hdel', KEYS[4], head)
  end
end

-- The lock is free: grant it to the first live waiter and tell it. The grant lasts until the
-- waiter's heartbeat deadline, which the waiter's own clock bounds from below (it is the send
-- time of its last successful heartbeat plus the lease): a waiter that died before picking the
-- grant up loses it then, and the next one is granted.
local function grant_next()
  local head, dl = live_head()
  if not head then
    return nil
  end
  redis.call('lpop', KEYS[3])
  redis.call('hdel', KEYS[4], head)
  local who_owner, who_gen = string.match(head, '^(.*)/([^/]*)$')
  -- Publish first: a server that refuses PUBLISH fails the script before anything changed.
  local token, prev = new_token()
  redis.call('publish', ARGV[5] .. head, token)
  take(who_owner, who_gen, math.max(dl - now, 1), token, prev)
  return head
end

-- Keeps the queue for at least a lease from now; never moves its expiry earlier: a waiter
-- with a shorter lease (a client with other settings) must not make the places of waiters
-- with longer ones expire.
local function keep_queue()
  for k = 3, 4 do
    if redis.call('pttl', KEYS[k]) < lease then
      redis.call('pexpire', KEYS[k], lease)
    end
  end
end

local function enqueue()
  if redis.call('hexists', KEYS[4], me) == 0 then
    redis.call('rpush', KEYS[3], me)
  end
  redis.call('hset', KEYS[4], me, now + lease)
  keep_queue()
end

local kind = redis.call('type', KEYS[1])['ok']
if kind ~= 'none' and kind ~= 'hash' then
  if ARGV[1] == 'renew' then
    return 0
  end
  if ARGV[1] == 'release' then
    return -3
  end
  return {-1}
end
local f = {false, false, false, false, false, false, false}
if kind == 'hash' then
  f = redis.call('hmget', KEYS[1], 'owner', 'count', 'token', 'gen', 'req', 'rel', 'prev')
  if f[1] == false then
    if ARGV[1] == 'renew' then
      return 0
    end
    if ARGV[1] == 'release' then
      return -3
    end
    return {-1}
  end
end
local mine = f[1] == owner and f[4] == gen

if ARGV[1] == 'acquire' then
  if f[1] == owner then
    if f[5] == gen then
      -- Granted to this very call (by a release, or an earlier try of it), or a retry of
      -- this re-entry: answer as the first time, and extend as the first time did.
      if f[4] == gen then
        extend(lease)
      else
        extend(ARGV[8])
      end
      return {1, f[3], tonumber(f[2]), f[4]}
    end
    if ARGV[6] ~= '' and f[4] == ARGV[6] then
      local count = redis.call('hincrby', KEYS[1], 'count', 1)
      redis.call('hset', KEYS[1], 'req', gen)
      extend(ARGV[8])
      return {1, f[3], count, f[4]}
    end
    -- Levels of this owner under another acquisition are orphans (a release whose reply was
    -- lost, or an acquisition given up as lost): a new one replaces them, as in acquire.lua.
    return {1, take(owner, gen, lease), 1, gen}
  end
  if kind == 'none' then
    local head = live_head()
    if head == nil or head == me then
      if head == me then
        redis.call('lpop', KEYS[3])
        redis.call('hdel', KEYS[4], me)
      end
      return {1, take(owner, gen, lease), 1, gen}
    end
    -- Free, but another live waiter came first: it gets the lock now; never barge past it.
    grant_next()
  end
  local wait = redis.call('pttl', KEYS[1])
  if ARGV[7] == '1' then
    enqueue()
    -- No message comes when a grant to a waiter that died runs out: wake by the first
    -- heartbeat deadline of a waiter ahead, each by its own lease, whoever holds the lock.
    for _, w in ipairs(redis.call('lrange', KEYS[3], 0, -1)) do
      if w == me then
        break
      end
      local dl = tonumber(redis.call('hget', KEYS[4], w) or '0') or 0
      if dl > now then
        wait = math.min(wait, dl - now)
      end
    end
  end
  return {0, wait}
end

if ARGV[1] == 'renew' then
  if mine then
    redis.call('pexpire', KEYS[1], lease)
    raise_fence(ARGV[6])
    return 1
  end
  local dl = tonumber(redis.call('hget', KEYS[4], me) or '0') or 0
  if dl > now then
    redis.call('hset', KEYS[4], me, now + lease)
    keep_queue()
    return 1
  end
  return 0
end

if ARGV[1] == 'cancel' then
  redis.call('lrem', KEYS[3], 0, me)
  redis.call('hdel', KEYS[4], me)
  if mine then
    return {1, f[3], tonumber(f[2]), f[4]}
  end
  if kind == 'none' then
    grant_next()
  end
  return {0, 0}
end

if ARGV[1] == 'release' then
  -- On a retry: whether the counter, or the grant after the caller's, says the caller's
  -- acquisition was the last one before the lock went (see release.lua).
  local retry = ARGV[9] ~= nil and ARGV[9] ~= ''
  local function last_was_mine(counter)
    return retry and counter ~= false and counter ~= '' and tonumber(counter) == tonumber(ARGV[9])
  end
  if kind == 'none' then
    local freed = last_was_mine(redis.call('get', KEYS[2]))
    raise_fence(ARGV[7])
    grant_next()
    if freed then
      return -4
    end
    return -1
  end
  if not mine then
    if last_was_mine(f[7]) then
      return -4
    end
    return -2
  end
  if f[6] == ARGV[6] then
    return tonumber(f[2])
  end
  if ARGV[8] == '1' then
    local count = redis.call('hincrby', KEYS[1], 'count', -1)
    if count < 1 then
      -- The server counts fewer levels than the holder: its outer levels still hold it.
      count = 1
      redis.call('hset', KEYS[1], 'count', 1)
    end
    redis.call('hset', KEYS[1], 'rel', ARGV[6])
    return count
  end
  -- The outermost level frees the lock whatever the count says: levels the server counts
  -- beyond the holder's own (an inner release that never arrived) must not keep it.
  redis.call('del', KEYS[1])
  raise_fence(ARGV[7])
  grant_next()
  return 0
end

return redis.error_reply('unknown fair mutex operation')
