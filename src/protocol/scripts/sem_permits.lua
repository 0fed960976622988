-- The leased semaphore: every acquisition of permits is a lease of its own. Atomic, one round
-- trip per operation.
--
-- KEYS[1]  the semaphore `P{T}:sem`, in one of two forms:
--          - a string when one acquisition holds permits: 'GEN|OWNER|N|S|US', expiring with
--            its lease (GEN: the acquisition, the request id of the acquire call; OWNER: the
--            owner id; N: the permits it holds; S, US: the server clock at the grant, TIME's
--            two fields);
--          - a sorted set when several do: each member 'GEN|OWNER|N|S|US' scored by its lease
--            deadline in server milliseconds, and the member 'w' (score +inf) while someone
--            waits; the key expires with the longest lease.
--          A string ending in '|w' has someone waiting: its release publishes.
-- KEYS[2]  release only: the release marker of the caller's acquisition
--          `P{T}:sem:released:<GEN>` (see there)
-- ARGV[1]  operation: 'a' acquire, 'r' release, 'u' permits used, 'i' info, 'f' force (a
--          holder's renewal is renew_holder.lua, which the read-write lock's readers share)
--
-- a  acquire  ARGV[2] 'GEN|OWNER|N' (N >= 1 permits wanted), ARGV[3] lease in milliseconds,
--             ARGV[4] the caller's permit count (N <= it), ARGV[5] '1' when the caller will
--             wait for a release if not granted (it is then flagged, so the release publishes)
--             Returns 1  held (the semaphore was free: one SET NX, nothing read)
--                     {1, 0, N, GEN}  held (also for a retry of the same call: nothing is
--                                     counted twice)
--                     {0, wait}  not enough permits free: the first lease to run out (a dead
--                                holder's) ends in `wait` ms; a release publishes before that
--                                when the caller is flagged
--                     {-1}  the key holds something locksmith did not write
-- r  release  ARGV[2] 'GEN|'. The same call serves a retry: a release moves the holder's
--             string to the marker (RENAME, so it lives as long as the lease had left), or
--             writes the marker for as long; the marker, named after the acquisition, says
--             that the first attempt released it.
--             Returns 0 released (a retry: by the first attempt), -1 not held (the lease had
--             run out, or Redis lost it), -3 foreign.
-- u  used     Returns the permits held by live leases.
-- i  info     Returns {S, US, holders}: the server clock (TIME's two fields) and the live
--             holders as a flat list of value, lease left in ms. {-1}: foreign.
-- f  force    Frees every permit, whoever holds it, and publishes. Returns the values removed
--             (as 'i' gives them), or {-1} when the key is foreign (left alone).
--
-- A release publishes 'released' on `P{T}:sem:released` only when a waiter flagged the
-- semaphore: every waiter's wait begins with a failing acquire that flags it. A sorted set's
-- flag is cleared by the release that publishes: every waiter it wakes tries again, and one
-- that fails flags it again.
--
-- Leases are measured by the server's clock (TIME) only; a sorted set's acquisitions whose lease
-- ran out are dropped by the next acquire, so a dead holder's permits come back one lease after
-- its last renewal.

local op = ARGV[1]
local t
if op == 'a' then
  t = redis.call('time')
  if redis.call('set', KEYS[1], ARGV[2] .. '|' .. t[1] .. '|' .. t[2], 'nx', 'px', ARGV[3]) then
    return 1
  end
elseif op == 'r' then
  local v = redis.pcall('get', KEYS[1])
  if type(v) == 'string' and string.sub(v, 1, #ARGV[2]) == ARGV[2] then
    if string.byte(v, -1) == FLAG_W then
      -- Published first: a server that refuses PUBLISH fails the script before anything
      -- changed.
      redis.call('publish', KEYS[1] .. ':released', 'released')
    end
    redis.call('rename', KEYS[1], KEYS[2])
    return 0
  end
end
-- @helpers

-- The slow paths and the other operations.

local function clock()
  t = t or redis.call('time')
  return ms_of(t)
end

-- The permits of a holder's string or member, or nil when it is not one.
local function permits(m)
  local n = string.match(m, '^[^|]+|[^|]+|(%d+)|%d+|%d+$')
  return tonumber(n)
end

-- The live members of the sorted set (dead ones are dropped when `drop`): a list of
-- {member, deadline}, whether the waiting flag is set, and the longest deadline.
local function members(now, drop)
  local all = redis.call('zrange', KEYS[1], 0, -1, 'withscores')
  local live, flagged, last, dead = {}, false, 0, {}
  for i = 1, #all, 2 do
    local m = all[i]
    if m == 'w' then
      flagged = true
    else
      local s = tonumber(all[i + 1])
      if s > now then
        live[#live + 1] = {m, s}
        last = math.max(last, s)
      else
        dead[#dead + 1] = m
      end
    end
  end
  if drop and #dead > 0 then
    redis.call('zrem', KEYS[1], unpack(dead))
  end
  return live, flagged, last
end

-- The released acquisition's marker, for a retry.
local function released_before()
  if redis.call('exists', KEYS[2]) == 1 then
    return 0
  end
  return -1
end

if op == 'a' then
  local now = clock()
  local me = ARGV[2] .. '|' .. t[1] .. '|' .. t[2]
  local gen = string.match(ARGV[2], '^[^|]*|')
  local n, lease, limit = permits(me), tonumber(ARGV[3]), tonumber(ARGV[4])
  local waits = ARGV[5] == '1'
  -- The semaphore's string (false: missing; nil: not a string, of the type `ty`).
  local v, ty = string_at(KEYS[1])
  if v then
    local flagged = string.byte(v, -1) == FLAG_W
    local held = v
    if flagged then
      held = string.sub(v, 1, -3)
    end
    local used = permits(held)
    if not used then
      return {-1}
    end
    local p = redis.call('pttl', KEYS[1])
    if starts(held, gen) then
      -- A retry of this very call: answer as the first time.
      if p < lease then
        redis.call('pexpire', KEYS[1], lease)
      end
      return {1, 0, used, string.sub(gen, 1, -2)}
    end
    if used + n <= limit then
      -- A second holder: the string becomes a sorted set of both.
      redis.call('del', KEYS[1])
      redis.call('zadd', KEYS[1], now + p, held, now + lease, me)
      if flagged then
        redis.call('zadd', KEYS[1], '+inf', 'w')
      end
      redis.call('pexpireat', KEYS[1], now + math.max(p, lease))
      return {1, 0, n, string.sub(gen, 1, -2)}
    end
    if waits and not flagged then
      redis.call('set', KEYS[1], v .. '|w', 'keepttl', 'xx')
    end
    return {0, math.max(p, 1)}
  end
  if v == false then
    redis.call('set', KEYS[1], me, 'px', lease)
    return 1
  end
  if ty ~= 'zset' then
    return {-1}
  end
  local live, flagged, last = members(now, true)
  local used, first = 0, nil
  for _, e in ipairs(live) do
    local m, s = e[1], e[2]
    local k = permits(m)
    if not k then
      return {-1}
    end
    if starts(m, gen) then
      -- A retry of this very call.
      redis.call('zadd', KEYS[1], now + lease, m)
      if now + lease > last then
        redis.call('pexpireat', KEYS[1], now + lease)
      end
      return {1, 0, k, string.sub(gen, 1, -2)}
    end
    used = used + k
    first = math.min(first or s, s)
  end
  if used + n <= limit then
    if #live == 0 then
      -- Nobody holds any more: back to a string.
      redis.call('del', KEYS[1])
      if flagged then
        me = me .. '|w'
      end
      redis.call('set', KEYS[1], me, 'px', lease)
    else
      redis.call('zadd', KEYS[1], now + lease, me)
      if now + lease > last then
        redis.call('pexpireat', KEYS[1], now + lease)
      end
    end
    return {1, 0, n, string.sub(gen, 1, -2)}
  end
  if waits and not flagged then
    redis.call('zadd', KEYS[1], '+inf', 'w')
  end
  return {0, math.max((first or now + lease) - now, 1)}
end

if op == 'r' then
  local v, ty = string_at(KEYS[1])
  if v ~= nil then
    -- Gone, or another acquisition's string.
    if v and not permits(string.gsub(v, '|w$', '')) then
      return -3
    end
    return released_before()
  end
  if ty ~= 'zset' then
    return -3
  end
  local now = clock()
  local live, flagged = members(now, false)
  for _, e in ipairs(live) do
    if starts(e[1], ARGV[2]) then
      if flagged then
        redis.call('publish', KEYS[1] .. ':released', 'released')
        redis.call('zrem', KEYS[1], 'w')
      end
      redis.call('zrem', KEYS[1], e[1])
      redis.call('set', KEYS[2], '1', 'px', math.max(e[2] - now, 1))
      return 0
    end
  end
  return released_before()
end

-- The live holders: a flat list of value, lease left in ms; nil when the key is foreign.
local function holders(now)
  return live_holders(KEYS[1], now, function(v)
    return permits((string.gsub(v, '|w$', '')))
  end)
end

if op == 'u' then
  -- The permits of the live holders (a foreign key: none).
  local used, h = 0, holders(clock()) or {}
  for i = 1, #h, 2 do
    used = used + (permits((string.gsub(h[i], '|w$', ''))) or 0)
  end
  return used
end

if op == 'i' then
  local now = clock()
  local h = holders(now)
  if not h then
    return {-1}
  end
  return {t[1], t[2], h}
end

if op == 'f' then
  local h = holders(clock())
  if not h then
    return {-1}
  end
  if #h > 0 then
    redis.call('publish', KEYS[1] .. ':released', 'released')
    redis.call('del', KEYS[1])
  end
  return values_of(h, {})
end

return redis.error_reply('unknown semaphore operation')
