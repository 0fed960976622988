-- Acquire, or re-enter, several locks at once: all of them, or none. One round trip, atomic.
-- Each lock is the very lock acquire.lua takes for its name (the same hash, the same fencing
-- counter, the same fields and re-entry rules), so a Mutex on one name and a set that
-- includes it exclude each other.
--
-- KEYS[2i-1]  lock hash of name i (i = 1..n)
-- KEYS[2i]    its fencing counter
-- ARGV[1]     lease in milliseconds of a new acquisition
-- ARGV[2]     request id: unique per acquire call, the same on a retry of that call (see
--             acquire.lua's ARGV[3]); a new acquisition of any name is named ('gen') after it
-- then, per name i, three arguments at ARGV[3i], ARGV[3i+1], ARGV[3i+2]:
--             the owner id it is taken for (the caller's, or for a re-entry the owner of the
--             caller's live hold); the acquisition of the caller's live hold on it, or ''; for
--             a re-entry, the lease in milliseconds the key must have left afterwards ('0':
--             leave the expiry as it is)
--
-- No hand-off block is reserved: a lock held through a set never passes locally.
--
-- Returns {1, token_1, count_1, gen_1, ..., token_n, count_n, gen_n}
--                  every lock is held by its owner now (count 1 and gen = ARGV[2]: newly
--                  acquired; otherwise re-entered)
--         {0, i, pttl}   lock i is held by another owner for pttl more milliseconds;
--                        nothing changed (the first such lock, in the order of KEYS)
--         {-1, i}        lock i's key is not a locksmith lock; nothing changed

-- See acquire.lua: the counter's lifetime, and how far ahead of the clock it may go.
local FENCE_TTL_MS = 86400000
-- See acquire.lua: how far ahead of the clock a counter that was gone starts.
local SEED_LEAD_US = 1000000 + 1024

local n = #KEYS / 2
local request = ARGV[2]
local now = redis.call('time')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])

-- Moves lock i's expiry to at least ms milliseconds from now; never earlier.
local function extend(i, ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', KEYS[2 * i - 1]) < ms then
    redis.call('pexpire', KEYS[2 * i - 1], ms)
  end
end

-- A new acquisition of lock i, as acquire.lua's grant() with no reserved block: the token by
-- its rule (a counter found gone starts SEED_LEAD_US ahead of the clock), and 'prev', the
-- counter as found.
local function grant(i, owner)
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  local found = redis.call('get', fence)
  local first = micros + SEED_LEAD_US
  if found then
    first = math.max((tonumber(found) or 0) + 1, micros)
  end
  local token = string.format('%.0f', first)
  redis.call('set', fence, token, 'px', FENCE_TTL_MS)
  redis.call('del', lock)
  redis.call('hset', lock, 'owner', owner, 'count', 1, 'token', token, 'gen', request,
    'req', request, 'prev', found or '')
  redis.call('pexpire', lock, ARGV[1])
  return {token, 1, request}
end

-- First every lock is looked at, and nothing is written unless all of them can be had.
local plan = {}
local fields = {}
for i = 1, n do
  local lock = KEYS[2 * i - 1]
  local owner, live = ARGV[3 * i], ARGV[3 * i + 1]
  local kind = redis.call('type', lock)['ok']
  if kind == 'none' then
    plan[i] = 'grant'
  elseif kind ~= 'hash' then
    return {-1, i}
  else
    local f = redis.call('hmget', lock, 'owner', 'count', 'token', 'req', 'gen')
    if f[1] == false then
      return {-1, i}
    end
    if f[1] ~= owner then
      return {0, i, redis.call('pttl', lock)}
    end
    fields[i] = f
    if f[4] == request then
      plan[i] = 'retry'
    elseif live == '' or f[5] ~= live then
      -- Levels of this owner under another acquisition are orphans: replaced.
      plan[i] = 'grant'
    else
      plan[i] = 'enter'
    end
  end
end

local out = {1}
for i = 1, n do
  local owner, ext = ARGV[3 * i], ARGV[3 * i + 2]
  local lock = KEYS[2 * i - 1]
  local r
  if plan[i] == 'grant' then
    r = grant(i, owner)
  elseif plan[i] == 'retry' then
    -- A retry of this very call: answer as the first time, extend as the first time did.
    local f = fields[i]
    if f[5] == request then
      extend(i, ARGV[1])
    else
      extend(i, ext)
    end
    r = {f[3], tonumber(f[2]), f[5]}
  else
    local f = fields[i]
    local count = redis.call('hincrby', lock, 'count', 1)
    redis.call('hset', lock, 'req', request)
    extend(i, ext)
    r = {f[3], count, f[5]}
  end
  out[#out + 1] = r[1]
  out[#out + 1] = r[2]
  out[#out + 1] = r[3]
end
return out
