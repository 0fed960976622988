-- Extend the leases of several locks in one call, each owner-checked on its own. Sent by the
-- renewal thread, several calls to a pipeline; see renew.lua for one lock.
--
-- KEYS[1..n]     the lock hashes
-- KEYS[n+1..2n]  their fencing counters, in the same order; only when ARGV[1] is '1'
-- ARGV[1]        '1': raise each counter to its holder's token (a quorum of masters, see
--                release.lua); '0': leave the counters alone (a single master), and pass
--                no counter keys
-- ARGV[2..]      per lock, in the order of KEYS: owner id, acquisition being renewed (the
--                lock's 'gen'), lease in milliseconds, and when ARGV[1] is '1' the holder's
--                fencing token
--
-- Returns an array with one entry per lock, in the order of KEYS:
--         1  extended
--         0  not held by that owner and acquisition any more (expired, deleted, another
--            owner, or a key of another type); nothing changed for that lock
--
-- One call covers at most a few hundred locks (the caller's bound), so that Redis is never
-- busy with one call for long.

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000

local fence = ARGV[1] == '1'
local stride = fence and 4 or 3
local n = fence and #KEYS / 2 or #KEYS
if #ARGV ~= 1 + n * stride or n ~= math.floor(n) then
  return redis.error_reply('ERR renew_batch: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not match')
end

local out = {}
for i = 1, n do
  local a = 1 + (i - 1) * stride
  -- pcall: a key of another type answers WRONGTYPE, which must not fail the other locks.
  local f = redis.pcall('hmget', KEYS[i], 'owner', 'gen')
  if f[1] == ARGV[a + 1] and f[2] == ARGV[a + 2] then
    redis.call('pexpire', KEYS[i], ARGV[a + 3])
    if fence then
      -- A counter of another type is left alone, and does not fail the other locks.
      local v = redis.pcall('get', KEYS[n + i])
      local last = type(v) == 'table' and math.huge or tonumber(v or '0') or 0
      if last < tonumber(ARGV[a + 4]) then
        redis.call('set', KEYS[n + i], ARGV[a + 4], 'px', FENCE_TTL_MS)
      end
    end
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
