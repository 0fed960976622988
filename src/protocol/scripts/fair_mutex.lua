-- The fair mutex: a lock string plus a queue of waiters in arrival order. Atomic, one round
-- trip per operation.
--
-- KEYS[1]  the lock `P{T}:fair`: a string expiring with the holder's lease, in one of two forms
--          - short (a fresh grant): 'GEN|OWNER|S|US'. GEN: the acquisition (the request id of
--            the acquiring call, or of the waiter it was granted to); OWNER: the owner id;
--            S, US: the server clock at the grant (TIME's two fields). Count 1, req = GEN,
--            rel = ''.
--          - long (after a re-entry or an inner release): 'GEN|OWNER|S|US|REQ|REL|COUNT'.
--            REQ: the request id of the last acquire call that counted a level; REL: the
--            request id of the last inner release.
--          Either ends in '|w' when the queue may hold waiters: its release grants the lock to
--          the first live one. The fencing token is S * 1000000 + US: S and US are the server
--          clock at the grant, or, when the fence gave a higher token (the clock went back),
--          the time of that token (`take_token` and `stamp`, prelude/fence.lua).
-- KEYS[2]  queue: a list of waiter ids in arrival order (id = OWNER .. '/' .. GEN)
-- KEYS[3]  waiters: a hash, waiter id -> heartbeat deadline in server milliseconds
-- KEYS[4]  the fencing mark of the name's hash slot `P{#N}:fence` (prelude/fence.lua): every
--          grant takes its token from it
-- KEYS[5]  release only: the release marker `P{T}:fair:released`. A release moves the lock
--          there (RENAME: it lives as long as the lease had left), or copies it there for as
--          long when it grants the lock on, so that a retried release tells "my first attempt
--          released it" (the marker starts with 'GEN|') from "it was gone".
-- ARGV[1]  operation: 'a' acquire, 'r' release, 'n' renew, 'c' cancel
--
-- a  acquire  ARGV[2] 'GEN|OWNER' (GEN: this call's request id), ARGV[3] lease in ms; optional:
--             ARGV[4] '1' to join the queue (or refresh its place) when not granted, ARGV[5] the
--             acquisition of the caller's live hold (a re-entry; '' none: levels of this owner
--             under any other acquisition are orphans and are replaced), ARGV[6] for a
--             re-entry, the lease in ms the key must have left afterwards (only ever moved
--             later; '0' leaves it), ARGV[7] a fixed lease in ms for a new acquisition (ARGV[3]
--             is then the lease of the caller's place in the queue only): a lock this call
--             takes gets it, and a lock granted to this call earlier (by a release) gets it
--             from now, exactly (the grant lasted to the caller's heartbeat deadline, which
--             its place's renewal kept; the caller stopped that renewal before this call).
--             Returns the token (held: the lock was free and nobody queued)
--                     {1, token, count, gen}  held under acquisition gen (count 1 and gen = GEN:
--                                             new, or granted to this waiter earlier;
--                                             otherwise re-entered)
--                     {0, wait}  not held; the caller is queued when ARGV[4] is '1'. wait:
--                                milliseconds until the lock may be free without a message:
--                                the holder's TTL, or sooner the heartbeat deadline of a
--                                waiter ahead (a grant to it ends there if it died)
--                     {-1}  the key is not a locksmith lock; nothing changed
-- r  release  ARGV[2] 'GEN|'; for an inner level: ARGV[3] the release call's request id (a retry
--             releases nothing twice) and ARGV[4] '1'. Without ARGV[4] the holder's outermost
--             level, which frees the lock whatever the count says. The same call serves a
--             retry.
--             Returns n >= 0 levels left, -1 gone, -2 another owner, -3 foreign, -4 released
--             by an earlier attempt of this release (the marker shows it). At zero the lock is
--             granted to the first live waiter, who is told on its channel
--             `P{T}:fair:grant:<waiter id>` (the message: the new token).
-- n  renew    ARGV[2] 'GEN|OWNER', ARGV[3] lease. Returns 1 when the caller's lock or its place
--             in the queue was extended, else 0.
-- c  cancel   ARGV[2] 'GEN|OWNER'. Leaves the queue. Returns {1, token, count, gen} when the
--             lock was granted to the caller before it left (it holds it), {0, 0} when not.
-- i  info     Returns {S, US, holder, pttl, waiters}: the server clock (TIME's two fields), the
--             lock's value ('' when free), its TTL in ms, and how many live waiters are queued.
--             {-1}: foreign.
-- f  force    Frees the lock whoever holds it, and grants it to the first live waiter (who is
--             told). Returns the value removed ('' when nobody held it), or {-1} when the key
--             is foreign (left alone).
--
-- Time is the server's clock (TIME): a waiter's heartbeat deadline is
-- never a client's clock.

local op = ARGV[1]
local t
if op == 'a' then
  t = redis.call('time')
  if redis.call('exists', KEYS[1], KEYS[2]) == 0 then
    local s, us, token = stamp(KEYS[4], t)
    redis.call('set', KEYS[1], ARGV[2] .. '|' .. s .. '|' .. us, 'px', ARGV[7] or ARGV[3])
    return token
  end
elseif op == 'r' then
  local v = redis.pcall('get', KEYS[1])
  if type(v) == 'string' and ARGV[4] ~= '1' and string.sub(v, 1, #ARGV[2]) == ARGV[2]
      and string.byte(v, -1) ~= FLAG_W then
    redis.call('rename', KEYS[1], KEYS[5])
    return 0
  end
end
-- @helpers

-- The slow paths and the other operations.

-- The server clock in milliseconds (TIME is read once per call, when first needed).
local now
local function clock()
  t = t or redis.call('time')
  now = now or ms_of(t)
  return now
end

-- The fields of a held lock's value, or nil when it is not one.
local function parse(v)
  local flagged = string.sub(v, -2) == '|w'
  if flagged then
    v = string.sub(v, 1, -3)
  end
  local gen, owner, s, us, rest = string.match(v, '^([^|]+)|([^|]+)|(%d+)|(%d+)(.*)$')
  if not gen then
    return nil
  end
  local f = {gen = gen, owner = owner, s = s, us = us, req = gen, rel = '', count = 1,
    flagged = flagged}
  if rest ~= '' then
    local req, rel, count = string.match(rest, '^|([^|]*)|([^|]*)|(%d+)$')
    if not req then
      return nil
    end
    f.req, f.rel, f.count = req, rel, tonumber(count)
  end
  return f
end

local function value(f)
  local v = f.gen .. '|' .. f.owner .. '|' .. f.s .. '|' .. f.us
  if f.count ~= 1 or f.req ~= f.gen or f.rel ~= '' then
    v = v .. '|' .. f.req .. '|' .. f.rel .. '|' .. f.count
  end
  if f.flagged then
    v = v .. '|w'
  end
  return v
end

local function token(f)
  return f.s * 1000000 + f.us
end

-- Drops dead waiters (heartbeat deadline passed) from the head of the queue. Returns the first
-- live waiter and its heartbeat deadline, or nil.
local function live_head()
  while true do
    local head = redis.call('lindex', KEYS[2], 0)
    if not head then
      return nil, 0
    end
    local dl = tonumber(redis.call('hget', KEYS[3], head) or '0') or 0
    if dl > clock() then
      return head, dl
    end
    redis.call('lpop', KEYS[2])
    redis.call('hdel', KEYS[3], head)
  end
end

-- Grants the lock (missing now) to acquisition `gen` of `owner` for ttl ms under the token of
-- `stamp` (s, us and token: a stamp taken already), flagged when waiters remain queued.
local function take(gen, owner, ttl, flagged, s, us, token)
  if not s then
    t = t or redis.call('time')
    s, us, token = stamp(KEYS[4], t)
  end
  local v = gen .. '|' .. owner .. '|' .. s .. '|' .. us
  if flagged then
    v = v .. '|w'
  end
  redis.call('set', KEYS[1], v, 'px', ttl)
  return token
end

-- The lock is free (or is being freed: `free` runs first, after the message): grant it to the
-- first live waiter and tell it. The grant lasts until the waiter's heartbeat deadline, which
-- the waiter's own clock bounds from below (it is the send time of its last successful
-- heartbeat plus the lease): a waiter that died before picking the grant up loses it then,
-- and the next one is granted. `more`: another waiter is about to queue.
local function grant_next(free, more)
  local head, dl = live_head()
  if not head then
    if free then
      free()
    end
    return nil
  end
  local who_owner, who_gen = string.match(head, '^(.*)/([^/]*)$')
  -- Published first: a server that refuses PUBLISH fails the script before anything changed
  -- (the mark raised by the stamp too: a raised mark is harmless).
  t = t or redis.call('time')
  local s, us, token = stamp(KEYS[4], t)
  redis.call('publish', KEYS[1] .. ':grant:' .. head, string.format('%.0f', token))
  if free then
    free()
  end
  redis.call('lpop', KEYS[2])
  redis.call('hdel', KEYS[3], head)
  take(who_gen, who_owner, math.max(dl - now, 1), more or redis.call('exists', KEYS[2]) == 1,
    s, us, token)
  return head
end

local gen, owner = string.match(ARGV[2] or '', '^([^|]*)|?(.*)$')
local me = owner .. '/' .. gen

if op == 'a' then
  local now, lease = clock(), tonumber(ARGV[3])
  -- The lease of a lock this call takes: a fixed one, or the caller's lease.
  local hold = tonumber(ARGV[7]) or lease
  -- The lock's value (false: missing; nil: a key of another type, foreign).
  local v = string_at(KEYS[1])
  local f = v and parse(v)
  if v == nil or (v and not f) then
    return {-1}
  end
  if f and f.owner == owner then
    if f.req == gen then
      -- Granted to this very call (by a release, or an earlier try of it), or a retry of
      -- this re-entry: answer as the first time, and extend as the first time did.
      if f.gen == gen and ARGV[7] then
        redis.call('pexpire', KEYS[1], hold)
      elseif f.gen == gen then
        extend(KEYS[1], lease)
      else
        extend(KEYS[1], ARGV[6])
      end
      return {1, token(f), f.count, f.gen}
    end
    if ARGV[5] and ARGV[5] ~= '' and f.gen == ARGV[5] then
      f.count = f.count + 1
      f.req = gen
      redis.call('set', KEYS[1], value(f), 'keepttl')
      extend(KEYS[1], ARGV[6])
      return {1, token(f), f.count, f.gen}
    end
    -- Levels of this owner under another acquisition are orphans (a release whose reply was
    -- lost, or an acquisition given up as lost): a new one replaces them, as in acquire.lua.
    return {1, take(gen, owner, hold, f.flagged), 1, gen}
  end
  if v == false then
    local head = live_head()
    if head == nil or head == me then
      if head == me then
        redis.call('lpop', KEYS[2])
        redis.call('hdel', KEYS[3], me)
      end
      return {1, take(gen, owner, hold, redis.call('exists', KEYS[2]) == 1), 1, gen}
    end
    -- Free, but another live waiter came first: it gets the lock now; never barge past it.
    grant_next(nil, ARGV[4] == '1')
    v = redis.call('get', KEYS[1])
  end
  -- PTTL is 0 in the last millisecond of the lease (the key is still there): the lock is free
  -- within a millisecond. Negative only for a key without expiry, which a grant never leaves.
  local wait = redis.call('pttl', KEYS[1])
  if wait == 0 then
    wait = 1
  elseif wait < 0 then
    wait = lease
  end
  if ARGV[4] == '1' then
    if redis.call('hexists', KEYS[3], me) == 0 then
      redis.call('rpush', KEYS[2], me)
    end
    redis.call('hset', KEYS[3], me, now + lease)
    -- The queue is kept for at least a lease from now, its expiry never moved earlier: a
    -- waiter with a shorter lease (a client with other settings) must not make the places of
    -- waiters with longer ones expire.
    extend(KEYS[2], lease)
    extend(KEYS[3], lease)
    if string.sub(v, -2) ~= '|w' then
      redis.call('set', KEYS[1], v .. '|w', 'keepttl', 'xx')
    end
    -- No message comes when a grant to a waiter that died runs out: wake by the first
    -- heartbeat deadline of a waiter ahead, each by its own lease, whoever holds the lock.
    for _, w in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
      if w == me then
        break
      end
      local dl = tonumber(redis.call('hget', KEYS[3], w) or '0') or 0
      if dl > now then
        wait = math.min(wait, dl - now)
      end
    end
  end
  return {0, wait}
end

if op == 'r' then
  local v = string_at(KEYS[1])
  local f = v and parse(v)
  if v == nil or (v and not f) then
    return -3
  end
  if f and string.sub(v, 1, #ARGV[2]) == ARGV[2] then
    if ARGV[4] == '1' then
      if f.rel == ARGV[3] then
        return f.count
      end
      -- The server counts fewer levels than the holder: its outer levels still hold it.
      f.count = math.max(f.count - 1, 1)
      f.rel = ARGV[3]
      redis.call('set', KEYS[1], value(f), 'keepttl')
      return f.count
    end
    -- The outermost level frees the lock whatever the count says: levels the server counts
    -- beyond the holder's own (an inner release that never arrived) must not keep it.
    grant_next(function()
      redis.call('rename', KEYS[1], KEYS[5])
    end)
    return 0
  end
  if not f then
    -- Gone: a holder whose lease ran out published nothing; grant to the next waiter now.
    grant_next()
  end
  -- Gone, or another acquisition's: did an earlier attempt of this release release it?
  local marker = redis.call('get', KEYS[5])
  if marker and string.sub(marker, 1, #ARGV[2]) == ARGV[2] then
    return -4
  end
  if f then
    return -2
  end
  return -1
end

if op == 'n' then
  local v = string_at(KEYS[1])
  if v and string.sub(v, 1, #gen + 1) == gen .. '|' then
    redis.call('pexpire', KEYS[1], ARGV[3])
    return 1
  end
  local now, lease = clock(), tonumber(ARGV[3])
  local dl = tonumber(redis.call('hget', KEYS[3], me) or '0') or 0
  if dl > now then
    redis.call('hset', KEYS[3], me, now + lease)
    extend(KEYS[2], lease)
    extend(KEYS[3], lease)
    return 1
  end
  return 0
end

if op == 'c' then
  redis.call('lrem', KEYS[2], 0, me)
  redis.call('hdel', KEYS[3], me)
  local v = string_at(KEYS[1])
  local f = v and parse(v)
  if f and f.gen == gen then
    return {1, token(f), f.count, f.gen}
  end
  if v == false then
    grant_next()
  end
  return {0, 0}
end

-- The lock's value as 'i' and 'f' show it: a string, '' when free; nil when the key is
-- foreign.
local function shown()
  local v = string_at(KEYS[1])
  if v == nil or (v and not parse(v)) then
    return nil
  end
  return v or ''
end

if op == 'i' then
  local now = clock()
  local v = shown()
  if not v then
    return {-1}
  end
  local live = 0
  local all = redis.call('hgetall', KEYS[3])
  for i = 2, #all, 2 do
    if (tonumber(all[i]) or 0) > now then
      live = live + 1
    end
  end
  return {t[1], t[2], v, redis.call('pttl', KEYS[1]), live}
end

if op == 'f' then
  local v = shown()
  if not v then
    return {-1}
  end
  if v ~= '' then
    redis.call('del', KEYS[1])
  end
  grant_next()
  return v
end

return redis.error_reply('unknown fair mutex operation')
