-- Acquire, or re-enter, a lock. One round trip, atomic.
--
-- KEYS[1]  lock hash (fields: owner, count, token, gen, req, rel)
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
--          within the acquiring client ('0' or absent: none). The counter is set to the last
--          token reserved, so every later acquisition, anywhere, gets a higher token than
--          any token of the block
--
-- Returns {1, token, count, gen, last}
--                                 held by ARGV[1] now under acquisition gen (count 1 and
--                                 gen = ARGV[3]: newly acquired; otherwise re-entered); last:
--                                 the last token reserved for local hand-offs (= token when
--                                 none was; only a new acquisition reserves)
--         {0, pttl}               held by another owner for pttl more milliseconds
--         {-1}                    the key exists but is not a locksmith lock; nothing changed

-- The fencing counter outlives every lock of its name by a day. Tokens stay strictly
-- increasing without it: a token is at most a few microseconds ahead of the server clock
-- that granted it (the larger of the counter + 1 and the clock, and grants of one name are
-- at least a release apart), or, with a quorum, ahead by the masters' clock skew (a counter
-- raised to another master's token). Redis expires the counter by the same clock, so once it
-- is gone that clock reads at least its last write plus FENCE_TTL_MS, and the next token
-- (at least the clock) exceeds every token issued before, as long as that lead stays under a
-- day. A block reserved for local hand-offs (ARGV[6]) puts the counter at most that many
-- tokens further ahead, and only while the counter is less than MAX_LEAD_US ahead of the
-- clock (else nothing is reserved): so the lead stays under MAX_LEAD_US plus one block, far
-- under a day, however fast grants come. src/keys.rs holds the same FENCE_TTL_MS (a unit
-- test compares them).
local FENCE_TTL_MS = 86400000
local MAX_LEAD_US = 1000000

-- Moves the key's expiry to at least ms milliseconds from now; never earlier.
local function extend(ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', KEYS[1]) < ms then
    redis.call('pexpire', KEYS[1], ms)
  end
end

-- A new acquisition: owner, count 1, a new token, the lease.
local function grant()
  -- The token never goes backwards, even when Redis restarted empty or the counter expired:
  -- it is the larger of the stored counter + 1 and the server clock in microseconds. Scripts
  -- replicate by effect, so replicas store the same value. Lua numbers are doubles, exact up
  -- to 2^53, which microseconds since 1970 stay under until the year 2255.
  local last = tonumber(redis.call('get', KEYS[2]) or '0') or 0
  local now = redis.call('time')
  local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local first = math.max(last + 1, micros)
  local block = tonumber(ARGV[6] or '0') or 0
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
    'req', ARGV[3])
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
    extend(ARGV[2])
  else
    extend(ARGV[5])
  end
  return {1, f[3], tonumber(f[2]), f[5]}
end
if ARGV[4] == '' or f[5] ~= ARGV[4] then
  return grant()
end
local count = redis.call('hincrby', KEYS[1], 'count', 1)
redis.call('hset', KEYS[1], 'req', ARGV[3])
extend(ARGV[5])
return {1, f[3], count, f[5]}
