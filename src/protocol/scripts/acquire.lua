-- Acquire, or re-enter, a lock. One round trip, atomic.
--
-- KEYS[1]  lock hash (fields: owner, count, token, gen, req, rel, prev)
-- KEYS[2]  fencing counter (a plain integer, expiring FENCE_TTL_MS after its last write)
-- ARGV[1]  owner id (client UUID and thread id)
-- ARGV[2]  lease in milliseconds of a new acquisition
-- ARGV[3]  request id: unique per acquire call across every client and process, the same on
--          a retry of that call, so a retry after a lost reply does not count a re-entry
--          twice; a new acquisition is named ('gen') after it, so 'gen' names one acquisition
--          of one owner anywhere (renew_batch.lua checks it alone)
-- ARGV[4]  the acquisition ('gen') of the caller's live hold on this lock (a re-entry), or ''
--          when it holds none. Levels of this owner under any other acquisition are orphans
--          (a release whose reply was lost, or an acquisition its holder gave up as lost): a
--          new acquisition replaces them instead of counting on top of them
-- ARGV[5]  for a re-entry: the lease in milliseconds the key must have left afterwards (the
--          hold's own lease); the expiry is only ever moved later, never earlier. '0' leaves
--          it as it is (a fixed lease, which ends a fixed time after its acquisition)
-- ARGV[6]  how many tokens a new acquisition reserves after its own, for local hand-offs
--          within the acquiring client ('0' or absent: none; at most MAX_BLOCK). The counter
--          is set to the last token reserved, so every later acquisition, anywhere, gets a
--          higher token than any token of the block
--
-- Returns {1, token, count, gen, last}
--                                 held by ARGV[1] now under acquisition gen (count 1 and
--                                 gen = ARGV[3]: newly acquired; otherwise re-entered); last:
--                                 the last token reserved for local hand-offs (= token when
--                                 none was; only a new acquisition reserves)
--         {0, pttl}               held by another owner for pttl more milliseconds
--         {-1}                    the key exists but is not a locksmith lock; nothing changed

-- The fencing counter outlives every lock of its name by a day. A new acquisition's token is
-- the larger of the counter + 1 and the server clock in microseconds, and the counter is set
-- to the last token it reserved. The rule that keeps tokens strictly increasing, even when the
-- counter is gone (Redis restarted empty, or a day without a write):
--
--   the counter is never more than SEED_LEAD_US ahead of the server clock, and a grant that
--   finds no counter starts at the clock + SEED_LEAD_US.
--
-- So the first token after the counter was lost exceeds every token issued before (all of
-- them at most the counter, which was at most its last write's clock + SEED_LEAD_US), as long
-- as the server's clock does not go back (a restart takes far more than a microsecond). Why
-- the lead stays under SEED_LEAD_US: a token is the counter + 1 or the clock, and grants of
-- one name are at least a release apart (more than a microsecond), so a grant without a block
-- does not add to the lead; a block (ARGV[6], at most MAX_BLOCK tokens) is reserved only while
-- the lead is under MAX_LEAD_US, so it ends under MAX_LEAD_US + MAX_BLOCK; a seeded counter
-- starts at SEED_LEAD_US, and reserves no block until the clock has caught up by MAX_BLOCK
-- microseconds. With a quorum, a counter may also be raised to another master's token (by a
-- release or a renewal): the lead then grows by the masters' clock skew. fair_mutex.lua and
-- rw_lock.lua grant from the same counter by the same rule. src/protocol/keys.rs holds the
-- same FENCE_TTL_MS, src/client.rs the same MAX_BLOCK (unit tests compare them).
local FENCE_TTL_MS = 86400000
local MAX_LEAD_US = 1000000
local MAX_BLOCK = 1024
local SEED_LEAD_US = MAX_LEAD_US + MAX_BLOCK

-- Moves the key's expiry to at least ms milliseconds from now; never earlier.
local function extend(ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', KEYS[1]) < ms then
    redis.call('pexpire', KEYS[1], ms)
  end
end

-- A new acquisition: owner, count 1, a new token, the lease. 'prev' keeps the counter as this
-- grant found it: a retried release of the acquisition before (release.lua) tells by it that
-- the lock went straight from that acquisition to this one, with no restart in between.
local function grant()
  -- Scripts replicate by effect, so replicas store the same value. Lua numbers are doubles,
  -- exact up to 2^53, which microseconds since 1970 stay under until the year 2255.
  local found = redis.call('get', KEYS[2])
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local first
  if found then
    first = math.max((tonumber(found) or 0) + 1, micros)
  else
    first = micros + SEED_LEAD_US
  end
  local block = math.min(tonumber(ARGV[6] or '0') or 0, MAX_BLOCK)
  if block < 0 or first - micros >= MAX_LEAD_US then
    block = 0
  end
  local token = string.format('%.0f', first)
  local upto = string.format('%.0f', first + block)
  redis.call('set', KEYS[2], upto, 'px', FENCE_TTL_MS)
  -- 'gen' names this acquisition (its request id): a release or renewal from a guard of an
  -- earlier acquisition by the same owner must not touch this one.
  redis.call('del', KEYS[1])
  redis.call('hset', KEYS[1], 'owner', ARGV[1], 'count', 1, 'token', token, 'gen', ARGV[3],
    'req', ARGV[3], 'prev', found or '')
  redis.call('pexpire', KEYS[1], ARGV[2])
  return {1, token, 1, ARGV[3], upto}
end

local kind = redis.call('type', KEYS[1])['ok']
if kind == 'none' then
  return grant()
end
if kind ~= 'hash' then
  return {-1}
end
local f = redis.call('hmget', KEYS[1], 'owner', 'count', 'token', 'req', 'gen')
if f[1] == false then
  return {-1}
end
if f[1] ~= ARGV[1] then
  return {0, redis.call('pttl', KEYS[1])}
end
if f[4] == ARGV[3] then
  -- A retry of this very call: answer as the first time, and extend as the first time did
  -- (the caller's clock starts the lease at the retry).
  if f[5] == ARGV[3] then
    -- A retried grant answers with the block its first run reserved: the counter, which no
    -- one has moved since (this acquisition holds the lock), stands at its last token. A
    -- retried release then finds the counter where the caller expects it.
    extend(ARGV[2])
    return {1, f[3], tonumber(f[2]), f[5], redis.call('get', KEYS[2]) or f[3]}
  end
  extend(ARGV[5])
  return {1, f[3], tonumber(f[2]), f[5]}
end
if ARGV[4] == '' or f[5] ~= ARGV[4] then
  return grant()
end
local count = redis.call('hincrby', KEYS[1], 'count', 1)
redis.call('hset', KEYS[1], 'req', ARGV[3])
extend(ARGV[5])
return {1, f[3], count, f[5]}
