-- The read-write lock's write acquire. The read-write lock: one writer, or many readers, each
-- holder a lease of its own. Each operation is a script of its own (rw_*.lua), atomic, one
-- round trip. Re-entry is counted by the client (one server entry per acquisition), so every
-- call concerns one acquisition.
--
-- Keys (each script says which it takes, in this order):
--   W   the writer `P{T}:rw`: a string 'GEN|OWNER|S|US' expiring with its lease (GEN: the
--       acquisition, the request id of the acquire call; OWNER: the owner id; S, US: the
--       server clock at the grant, TIME's two fields, or the time of the fence's token where
--       the clock went back, see prelude/fence.lua; the fencing token is S * 1000000 + US).
--       It may end in flags: '|' and letters, 'w' a writer waits, 'd' a reader that defers to
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
-- Who is woken: a waiter's attempt flags the holders in its way (the writer, or the readers),
-- and a release publishes only for its flags: a writer's release on `free` for a waiting
-- writer, on `open` for waiting readers that do not defer, and for deferring ones when no
-- writer waits; the last reader's release on `free`. A writer granted while others wait is
-- flagged for them at once.
--
-- Time is the server's clock (TIME). Expired readers and waiters are dropped on the slow paths.
--
-- This script: KEYS W, R, WW, WR, WE, F (the fencing mark of the name's hash slot `P{#N}:fence`:
-- the writer takes its token from it, `stamp` in prelude/fence.lua).
-- ARGV[1]  'GEN|OWNER'
-- ARGV[2]  lease in ms
-- ARGV[3]  '1' to register as a waiting writer when not granted (and to leave the
--          registration when granted)
-- Returns the token (held, nothing was in the way), {1, token, 1, GEN} (held; also for a retry
-- of the same call), {0, wait_ms} (not held), {-1} (foreign keys).

local t = redis.call('time')
if redis.call('exists', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) == 0 then
  local s, us, token = stamp(KEYS[6], t)
  redis.call('set', KEYS[1], ARGV[1] .. '|' .. s .. '|' .. us, 'px', ARGV[2])
  return token
end
-- @helpers

local now, lease = ms_of(t), tonumber(ARGV[2])
local gen, owner = string.match(ARGV[1], '^([^|]*)|(.*)$')
local me = owner .. '/' .. gen
local register = ARGV[3] == '1'
if not zsets(3, 5) then
  return {-1}
end
local ok, w, wait, g = writer_in_way(owner, 'w', register)
if not ok then
  return {-1}
end
if g == gen then
  -- A retry of this very call.
  redis.call('pexpire', KEYS[1], lease)
  local s, us = string.match(w, '^[^|]+|[^|]+|(%d+)|(%d+)')
  return {1, s * 1000000 + us, 1, gen}
end
-- A writer held by an earlier acquisition of this very thread that it no longer knows of (a
-- release whose reply was lost) is replaced by a new acquisition, as the plain mutex does.
if w == false then
  -- Readers other than this thread's own read levels keep a writer out.
  local r, rty = string_at(KEYS[2])
  if r == nil then
    if rty ~= 'zset' then
      return {-1}
    end
    local others, any, first, flagged = readers(now, owner)
    if others > 0 then
      -- The first reader's lease ends at `first` (server ms): the wait is what is left of it.
      wait = first - now
      if register and not flagged then
        redis.call('zadd', KEYS[2], '+inf', 'w')
      end
    elseif not any then
      redis.call('del', KEYS[2])
    end
  elseif r then
    local rg, o = rw_parse(r)
    if not rg then
      return {-1}
    end
    if o ~= owner then
      wait = redis.call('pttl', KEYS[2])
      if register then
        add_flag(KEYS[2], r, 'w')
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
redis.call('set', KEYS[1], ARGV[1] .. '|' .. s .. '|' .. us .. flags, 'px', lease)
return {1, token, 1, gen}
