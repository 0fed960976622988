-- The read-write lock: one writer, or many readers, each holder a lease of its own. Atomic,
-- one round trip per operation. Re-entry is counted by the client (one server entry per
-- acquisition), so every call here concerns one acquisition.
--
-- Keys (the operations below say which they take, in this order):
--   W   the writer `P{T}:rw`: a string 'GEN|OWNER|S|US' expiring with its lease (GEN: the
--       acquisition, the request id of the acquire call; OWNER: the owner id; S, US: the
--       server clock at the grant, TIME's two fields, or just above the fencing mark where the
--       clock went back, see fence.lua; the fencing token is S * 1000000 + US + LEAD_US). It
--       may end in flags: '|' and letters, 'w' a writer waits, 'd' a reader that defers to
--       waiting writers waits, 'e' a reader that does not defer waits; the release publishes
--       for them.
--   R   the readers `P{T}:rw:readers`: one reader as a string 'GEN|OWNER|S|US' expiring with its
--       lease (ending in '|w' when a writer waits); several as a sorted set of such members
--       scored by their lease deadlines in server milliseconds, with the member 'w' (score +inf)
--       when a writer waits; the set expires with the longest lease.
--   WW  waiting writers `P{T}:rw:wwait`: a sorted set, waiter id (OWNER/GEN) -> the deadline of
--       its registration (server ms), refreshed by each attempt
--   WR  waiting readers that defer to waiting writers `P{T}:rw:rwait`: as WW
--   WE  waiting readers that do not defer `P{T}:rw:eager`: as WW
--   M   release only: the release marker. The writer's `P{T}:rw:released`; a reader's
--       `P{T}:rw:released:<GEN>`. A release moves the holder's string there (RENAME: it lives
--       as long as the lease had left), or writes it for as long, so that a retried release
--       tells "my first attempt released it" from "it was gone".
-- Channels: `P{T}:rw:free` (published when the lock is free for a waiting writer: one writer
-- per client asks) and `P{T}:rw:open` (published when readers may enter: every reader wakes).
--
-- ARGV[1]  operation:
-- w  write    KEYS W, R, WW, WR, WE, F (the name's fencing mark `P{T}:fence`, see fence.lua:
--             the writer's token is above it, and raises it). ARGV[2] 'GEN|OWNER', ARGV[3] lease in ms, ARGV[4] '1' to
--             register as a waiting writer when not granted (and to leave the registration when
--             granted).
--             Returns the token (held, nothing was in the way), {1, token, 1, GEN} (held; also
--             for a retry of the same call), {0, wait_ms} (not held), {-1} (foreign keys).
-- r  read, deferring to waiting writers (writer preference); R  read, not deferring.
--             KEYS W, R, WW (and WR, WE with ARGV[4]). ARGV[2] 'GEN|OWNER', ARGV[3] lease,
--             ARGV[4] '1' to register as a waiting reader when not granted (and to leave the
--             registration when granted).
--             Returns 1 or {1, 0, 1, GEN} held, {0, wait_ms} not held, {-1} foreign keys.
-- x  release the writer: KEYS W, M. ARGV[2] 'GEN|'.
-- y  release a reader: KEYS R, M. ARGV[2] 'GEN|'.
--             Both return 0 released (a retry: released by the first attempt, as the marker
--             shows), -1 not held (the lease ran out, or Redis lost it), -2 another acquisition
--             holds the writer, -3 foreign keys.
-- n  renew the writer (KEYS W), m renew a reader (KEYS R): ARGV[2] 'GEN|', ARGV[3] lease.
--             Return 1 extended, 0 not held.
-- e  re-enter: KEYS W, R. ARGV[2] 'GEN|', ARGV[3] 'write' or 'read', ARGV[4] the lease in ms
--             the hold must have left afterwards (only ever moved later; '0' leaves it).
--             Returns 1 when that acquisition still holds, 0 when it does not any more
--             (nothing changed, nothing is recreated for it).
-- c  cancel: KEYS W, R, WW, WR, WE. ARGV[2] 'GEN|OWNER'. Leaves the waiting sets (a waiter
--             that gives up); returns 0.
-- i  info: KEYS W, R, WW, WR, WE. Returns {S, US, writer, pttl, readers, waiting}: the server
--             clock (TIME's two fields); the writer's value ('' none; '|OWNER|1|TOKEN' for a
--             writer hash of the layout before) and its TTL in ms; the live readers as a flat
--             list of value, lease left in ms (a member 'OWNER/GEN' of the layout before as it
--             is); how many waiting writers and readers are registered. {-1}: foreign keys.
-- f  force: KEYS W, R. Frees the writer and every reader, whoever they are, and publishes on
--             both channels. Returns the values removed (as 'i' gives them), or {-1} when the keys
--             are foreign (left alone).
--
-- Who is woken: a waiter's attempt flags the holders in its way (the writer, or the readers),
-- and a release publishes only for its flags: a writer's release on `free` for a waiting
-- writer, on `open` for waiting readers that do not defer, and for deferring ones when no
-- writer waits; the last reader's release on `free`. A writer granted while others wait is
-- flagged for them at once.
--
-- A hash at W is a writer of the layout before (an older client's): held, busy.
-- Time is the server's clock (TIME). Expired readers and waiters are dropped on the slow paths.

local op = ARGV[1]
local t
if op == 'w' then
  t = redis.call('time')
  if redis.call('exists', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) == 0 then
    local token = t[1] * 1000000 + t[2] + LEAD_US
    if raise_mark(KEYS[6], token) then
      redis.call('set', KEYS[1], ARGV[2] .. '|' .. t[1] .. '|' .. t[2], 'px', ARGV[3])
      return token
    end
  end
elseif op == 'r' or op == 'R' then
  t = redis.call('time')
  if ARGV[4] ~= '1' and redis.call('exists', KEYS[1], KEYS[3]) == 0
      and redis.call('set', KEYS[2], ARGV[2] .. '|' .. t[1] .. '|' .. t[2], 'nx', 'px', ARGV[3]) then
    return 1
  end
elseif op == 'x' or op == 'y' then
  local v = redis.pcall('get', KEYS[1])
  if type(v) == 'string' and string.sub(v, 1, #ARGV[2]) == ARGV[2] then
    if string.byte(v, -1) > 57 then
      -- Flagged: someone waits. Published first: a server that refuses PUBLISH fails the
      -- script before anything changed.
      local flags = string.match(v, '|(%a+)$') or ''
      local root = string.match(KEYS[1], '^(.*:rw)')
      local writers = string.find(flags, 'w', 1, true)
      if op == 'y' or writers then
        redis.call('publish', root .. ':free', 'free')
      end
      if string.find(flags, 'e', 1, true) or (not writers and string.find(flags, 'd', 1, true)) then
        redis.call('publish', root .. ':open', 'open')
      end
    end
    redis.call('rename', KEYS[1], KEYS[2])
    return 0
  end
end

-- The slow paths and the other operations.

local function clock()
  t = t or redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function starts(s, prefix)
  return string.sub(s, 1, #prefix) == prefix
end

-- A holder's string or member: its fields GEN, OWNER and its flags ('' none), or nil when it is
-- not one.
local function parse(v)
  local gen, owner, flags = string.match(v, '^([^|]+)|([^|]+)|%d+|%d+|?(%a*)$')
  return gen, owner, flags
end

-- A string holder at `key`: its value, or false when missing; nil, and the key's type, when it
-- holds something else.
local function get(key)
  local v = redis.pcall('get', key)
  if type(v) == 'table' then
    return nil, redis.call('type', key)['ok']
  end
  return v
end

-- Adds `flag` to the flags of the string `v` at `key` (kept expiry).
local function flag(key, v, f)
  local _, _, flags = parse(v)
  if flags == '' then
    redis.call('set', key, v .. '|' .. f, 'keepttl', 'xx')
  elseif not string.find(flags, f, 1, true) then
    redis.call('set', key, v .. f, 'keepttl', 'xx')
  end
end

-- Records `id` in the waiting set `key` until a lease from now; the key's expiry only ever
-- moves later (waiters may have leases of different lengths).
local function touch(key, id, now, lease)
  redis.call('zadd', key, now + lease, id)
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
end

-- Live entries of the waiting set `key` (expired ones dropped), and the first deadline.
local function waiting(key, now)
  redis.call('zremrangebyscore', key, '-inf', now)
  local first = redis.call('zrange', key, 0, 0, 'withscores')
  if first[2] then
    return redis.call('zcard', key), math.max(tonumber(first[2]) - now, 1)
  end
  return 0, nil
end

-- The readers' sorted set: dead readers dropped; the live readers of owners other than `owner`,
-- whether any reader is left, the first deadline, and whether the writers' flag is set.
local function readers(now, owner)
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  local all = redis.call('zrange', KEYS[2], 0, -1, 'withscores')
  local others, any, first, flagged = 0, false, nil, false
  for i = 1, #all, 2 do
    if all[i] == 'w' then
      flagged = true
    else
      any = true
      local s = tonumber(all[i + 1])
      first = math.min(first or s, s)
      local _, o = parse(all[i])
      -- A member of the layout before (OWNER/GEN) is another owner's.
      if o ~= owner then
        others = others + 1
      end
    end
  end
  return others, any, first, flagged
end

-- The member of acquisition `gen` ('GEN|') in the readers' sorted set `key`, and its deadline.
local function find_reader(key, gen)
  local cursor = '0'
  repeat
    local r = redis.call('zscan', key, cursor, 'match', gen .. '*', 'count', 1000)
    cursor = r[1]
    if r[2][1] then
      return r[2][1], tonumber(r[2][2])
    end
  until cursor == '0'
  return nil
end

-- Moves the expiry of `key` to at least `ms` from now; never earlier.
local function extend(key, ms)
  if ms > 0 and redis.call('pttl', key) < ms then
    redis.call('pexpire', key, ms)
  end
end

-- After a waiting writer gave up: wake whoever can now proceed (as a release would).
local function wake(now)
  if redis.call('exists', KEYS[1]) == 1 then
    return
  end
  local writers = waiting(KEYS[3], now)
  local r, ty = get(KEYS[2])
  local any = r ~= false
  if ty == 'zset' then
    local _, a = readers(now, '')
    any = a
  end
  local root = string.match(KEYS[1], '^(.*:rw)')
  if not any and writers > 0 then
    redis.call('publish', root .. ':free', 'free')
  end
  local eager = waiting(KEYS[5], now)
  local deferring = waiting(KEYS[4], now)
  if eager > 0 or (deferring > 0 and writers == 0) then
    redis.call('publish', root .. ':open', 'open')
  end
end

-- Whether KEYS[from..to] (waiting sets) are sorted sets or missing.
local function zsets(from, to)
  for i = from, to do
    local ty = redis.call('type', KEYS[i])['ok']
    if ty ~= 'none' and ty ~= 'zset' then
      return false
    end
  end
  return true
end

local function busy_key(key)
  local p = redis.call('pttl', key)
  if p < 1 then
    p = tonumber(ARGV[3])
  end
  return p
end

if op == 'w' then
  local now, lease = clock(), tonumber(ARGV[3])
  local gen, owner = string.match(ARGV[2], '^([^|]*)|(.*)$')
  local me = owner .. '/' .. gen
  local register = ARGV[4] == '1'
  if not zsets(3, 5) then
    return {-1}
  end
  local w, wty = get(KEYS[1])
  local wait = nil
  if w == nil then
    if wty == 'hash' and redis.call('hexists', KEYS[1], 'owner') == 1 then
      wait = busy_key(KEYS[1])
    else
      return {-1}
    end
  elseif w then
    local g, o = parse(w)
    if not g then
      return {-1}
    end
    if g == gen then
      -- A retry of this very call.
      redis.call('pexpire', KEYS[1], lease)
      local s, us = string.match(w, '^[^|]+|[^|]+|(%d+)|(%d+)')
      return {1, s * 1000000 + us + LEAD_US, 1, gen}
    end
    if o ~= owner then
      wait = redis.call('pttl', KEYS[1])
      if register then
        flag(KEYS[1], w, 'w')
      end
    end
    -- Held by an earlier acquisition of this very thread that it no longer knows of (a release
    -- whose reply was lost): a new acquisition replaces it, as the plain mutex does.
  else
    -- Readers other than this thread's own read levels keep a writer out.
    local r, rty = get(KEYS[2])
    if r == nil then
      if rty ~= 'zset' then
        return {-1}
      end
      local others, any, first, flagged = readers(now, owner)
      if others > 0 then
        wait = first
        if register and not flagged then
          redis.call('zadd', KEYS[2], '+inf', 'w')
        end
      elseif not any then
        redis.call('del', KEYS[2])
      end
    elseif r then
      local g, o = parse(r)
      if not g then
        return {-1}
      end
      if o ~= owner then
        wait = redis.call('pttl', KEYS[2])
        if register then
          flag(KEYS[2], r, 'w')
        end
      end
    end
  end
  if wait then
    if register then
      touch(KEYS[3], me, now, lease)
    end
    return {0, math.max(wait, 1)}
  end
  if register then
    redis.call('zrem', KEYS[3], me)
  end
  -- Flagged for whoever waits: they are woken by this writer's release.
  local flags = ''
  for i, f in ipairs({'w', 'd', 'e'}) do
    if redis.call('zcount', KEYS[i + 2], '(' .. now, '+inf') > 0 then
      flags = flags .. f
    end
  end
  if flags ~= '' then
    flags = '|' .. flags
  end
  local s, us, token = stamp(KEYS[6], t)
  redis.call('set', KEYS[1], ARGV[2] .. '|' .. s .. '|' .. us .. flags, 'px', lease)
  return {1, token, 1, gen}
end

if op == 'r' or op == 'R' then
  local now, lease = clock(), tonumber(ARGV[3])
  local gen, owner = string.match(ARGV[2], '^([^|]*)|(.*)$')
  local me = owner .. '/' .. gen
  local defer, register = op == 'r', ARGV[4] == '1'
  local mine = ARGV[2] .. '|' .. t[1] .. '|' .. t[2]
  if not zsets(3, register and 5 or 3) then
    return {-1}
  end
  local w, wty = get(KEYS[1])
  local wait = nil
  if w == nil then
    if wty == 'hash' and redis.call('hexists', KEYS[1], 'owner') == 1 then
      wait = busy_key(KEYS[1])
    else
      return {-1}
    end
  elseif w then
    local g, o = parse(w)
    if not g then
      return {-1}
    end
    if o ~= owner then
      wait = redis.call('pttl', KEYS[1])
      if register then
        flag(KEYS[1], w, defer and 'd' or 'e')
      end
    end
  end
  local writers, first = waiting(KEYS[3], now)
  if defer and first and (wait or not w) then
    -- After the writer's release, a waiting writer that died keeps this reader out until its
    -- own deadline, and no message comes then: wake by that deadline too. (A thread that
    -- holds the write lock reads past waiting writers: a downgrade.)
    wait = math.min(wait or first, first)
  end
  if wait then
    if register then
      touch(defer and KEYS[4] or KEYS[5], me, now, lease)
    end
    return {0, math.max(wait, 1)}
  end
  local r, rty = get(KEYS[2])
  local wflag = writers > 0
  if r == false then
    if wflag then
      mine = mine .. '|w'
    end
    redis.call('set', KEYS[2], mine, 'px', lease)
  elseif r then
    local g = parse(r)
    if not g then
      return {-1}
    end
    local p = redis.call('pttl', KEYS[2])
    if starts(r, gen .. '|') then
      -- A retry of this very call.
      extend(KEYS[2], lease)
      return {1, 0, 1, gen}
    end
    -- A second reader: the string becomes a sorted set of both.
    local held, flagged = r, string.byte(r, -1) == 119
    if flagged then
      held = string.sub(r, 1, -3)
    end
    redis.call('del', KEYS[2])
    redis.call('zadd', KEYS[2], now + p, held, now + lease, mine)
    if flagged or wflag then
      redis.call('zadd', KEYS[2], '+inf', 'w')
    end
    redis.call('pexpireat', KEYS[2], now + math.max(p, lease))
  else
    if rty ~= 'zset' then
      return {-1}
    end
    redis.call('zremrangebyscore', KEYS[2], '-inf', now)
    local m = find_reader(KEYS[2], gen .. '|')
    if m then
      -- A retry of this very call.
      redis.call('zadd', KEYS[2], 'gt', now + lease, m)
      extend(KEYS[2], lease)
      return {1, 0, 1, gen}
    end
    redis.call('zadd', KEYS[2], now + lease, mine)
    if wflag then
      redis.call('zadd', KEYS[2], '+inf', 'w')
    end
    extend(KEYS[2], lease)
  end
  if register then
    redis.call('zrem', KEYS[4], me)
    redis.call('zrem', KEYS[5], me)
  end
  return {1, 0, 1, gen}
end

if op == 'x' or op == 'y' then
  local v, ty = get(KEYS[1])
  if v == nil then
    if op == 'x' then
      if ty == 'hash' then
        return -2
      end
      return -3
    end
    if ty ~= 'zset' then
      return -3
    end
    -- One of several readers.
    local now = clock()
    local m, s = find_reader(KEYS[1], ARGV[2])
    if m and s > now then
      redis.call('zremrangebyscore', KEYS[1], '-inf', now)
      -- The last reader frees the lock for a waiting writer.
      local last = redis.call('zcount', KEYS[1], '(' .. now, '(+inf') <= 1
      if last and redis.call('zscore', KEYS[1], 'w') then
        redis.call('publish', string.match(KEYS[1], '^(.*:rw)') .. ':free', 'free')
      end
      if last then
        redis.call('del', KEYS[1])
      else
        redis.call('zrem', KEYS[1], m)
      end
      redis.call('set', KEYS[2], '1', 'px', math.max(s - now, 1))
      return 0
    end
  elseif v and not parse(v) then
    return -3
  end
  -- Gone, or another acquisition's: did the first attempt of this release release it?
  local marker = redis.call('get', KEYS[2])
  if marker and (op == 'y' or starts(marker, ARGV[2])) then
    return 0
  end
  if v and op == 'x' then
    return -2
  end
  return -1
end

if op == 'n' or op == 'm' then
  local lease = tonumber(ARGV[3])
  local v, ty = get(KEYS[1])
  if v then
    if starts(v, ARGV[2]) then
      redis.call('pexpire', KEYS[1], lease)
      return 1
    end
    return 0
  end
  if op == 'n' or ty ~= 'zset' then
    return 0
  end
  local now = clock()
  local m, s = find_reader(KEYS[1], ARGV[2])
  if m and s > now then
    redis.call('zadd', KEYS[1], now + lease, m)
    extend(KEYS[1], lease)
    return 1
  end
  return 0
end

if op == 'e' then
  local ms = tonumber(ARGV[4]) or 0
  local key = KEYS[1]
  if ARGV[3] == 'read' then
    key = KEYS[2]
  end
  local v, ty = get(key)
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
  local now = clock()
  local m, s = find_reader(KEYS[2], ARGV[2])
  if not m or s <= now then
    return 0
  end
  if ms > 0 and s < now + ms then
    redis.call('zadd', KEYS[2], now + ms, m)
  end
  extend(KEYS[2], ms)
  return 1
end

if op == 'c' then
  local now = clock()
  local gen, owner = string.match(ARGV[2], '^([^|]*)|(.*)$')
  local me = owner .. '/' .. gen
  if not zsets(3, 5) then
    return 0
  end
  local was_writer = redis.call('zrem', KEYS[3], me)
  redis.call('zrem', KEYS[4], me)
  redis.call('zrem', KEYS[5], me)
  if was_writer == 1 then
    -- Readers deferring to this writer may go now.
    local _, wty = get(KEYS[1])
    local _, rty = get(KEYS[2])
    if (wty == nil or wty == 'hash') and (rty == nil or rty == 'zset') then
      wake(now)
    end
  end
  return 0
end

-- The writer's value ('' none, or an older client's writer hash as '|OWNER|1|TOKEN') and the
-- live readers (value, lease left in ms, flat); nil when a key is foreign.
local function holders(now)
  local w, wty = get(KEYS[1])
  if w and not parse(w) then
    return nil
  end
  if w == nil then
    if wty ~= 'hash' then
      return nil
    end
    local h = redis.call('hmget', KEYS[1], 'owner', 'token')
    w = '|' .. (h[1] or '') .. '|1|' .. (h[2] or '0')
  end
  local out = {}
  local r, rty = get(KEYS[2])
  if r then
    if not parse(r) then
      return nil
    end
    out = {r, redis.call('pttl', KEYS[2])}
  elseif r == nil then
    if rty ~= 'zset' then
      return nil
    end
    local all = redis.call('zrangebyscore', KEYS[2], '(' .. now, '(+inf', 'withscores')
    for i = 1, #all, 2 do
      out[#out + 1] = all[i]
      out[#out + 1] = math.floor(tonumber(all[i + 1]) - now)
    end
  end
  return w or '', out
end

if op == 'i' then
  local now = clock()
  if not zsets(3, 5) then
    return {-1}
  end
  local w, readers_ = holders(now)
  if not w then
    return {-1}
  end
  local waiting = 0
  for i = 3, 5 do
    waiting = waiting + redis.call('zcount', KEYS[i], '(' .. now, '+inf')
  end
  return {t[1], t[2], w, redis.call('pttl', KEYS[1]), readers_, waiting}
end

if op == 'f' then
  local w, readers_ = holders(clock())
  if not w then
    return {-1}
  end
  if w ~= '' or #readers_ > 0 then
    local root = string.match(KEYS[1], '^(.*:rw)')
    redis.call('publish', root .. ':free', 'free')
    redis.call('publish', root .. ':open', 'open')
    redis.call('del', KEYS[1], KEYS[2])
  end
  local out = {w}
  for i = 1, #readers_, 2 do
    out[#out + 1] = readers_[i]
  end
  return out
end

return redis.error_reply('unknown read-write lock operation')
