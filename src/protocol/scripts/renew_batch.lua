-- Extend the leases of several locks in one call, each owner- and acquisition-checked on its
-- own. Sent by the renewal thread, several calls to a pipeline; see renew.lua for one lock.
--
-- KEYS[1..n]     the lock hashes
-- KEYS[n+1..2n]  their fencing counters, in the same order; only when ARGV[1] is '1'
-- ARGV[1]        '1': raise each counter to its holder's token (a quorum of masters, see
--                release.lua); '0': leave the counters alone (a single master), and pass
--                no counter keys
-- ARGV[2]        g, the number of runs: consecutive locks of one owner and one lease
-- ARGV[3..2+3g]  per run: owner id, lease in milliseconds, how many locks (of KEYS, in order)
-- then           per lock, in the order of KEYS: the acquisition being renewed (the lock's
--                'gen'); then, when ARGV[1] is '1', per lock the holder's fencing token
--
-- The owner and the lease are sent once per run, not once per lock: most of a client's locks
-- share them, and every argument costs Redis a parse and a Lua string.
--
-- Returns the positions (1-based, in the order of KEYS) of the locks NOT extended: not held by
-- that owner and acquisition any more (expired, deleted, another owner, or a key of another
-- type); nothing changed for those. Every other lock was extended. Usually empty.
--
-- One call covers at most a few hundred locks (the caller's bound), so that Redis is never
-- busy with one call for long.

-- See acquire.lua: the counter's lifetime after its last write.
local FENCE_TTL_MS = 86400000

local fence = ARGV[1] == '1'
local runs = tonumber(ARGV[2]) or -1
local n = fence and #KEYS / 2 or #KEYS
local gens = 2 + 3 * runs
if runs < 0 or n ~= math.floor(n) or #ARGV ~= gens + n * (fence and 2 or 1) then
  return redis.error_reply('ERR renew_batch: ' .. #KEYS .. ' keys and ' .. #ARGV .. ' arguments do not match')
end
local tokens = gens + n
local call, pcall = redis.call, redis.pcall

local failed = {}
local i = 0
for r = 1, runs do
  local a = 3 * r
  local owner, lease, count = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]) or 0
  if i + count > n then
    return redis.error_reply('ERR renew_batch: the runs cover more than ' .. n .. ' keys')
  end
  for _ = 1, count do
    i = i + 1
    -- pcall: a key of another type answers WRONGTYPE, which must not fail the other locks.
    local f = pcall('hmget', KEYS[i], 'owner', 'gen')
    if f[1] == owner and f[2] == ARGV[gens + i] then
      call('pexpire', KEYS[i], lease)
      if fence then
        -- A counter of another type is left alone, and does not fail the other locks.
        local v = pcall('get', KEYS[n + i])
        local last = type(v) == 'table' and math.huge or tonumber(v or '0') or 0
        if last < tonumber(ARGV[tokens + i]) then
          call('set', KEYS[n + i], ARGV[tokens + i], 'px', FENCE_TTL_MS)
        end
      end
    else
      failed[#failed + 1] = i
    end
  end
end
if i ~= n then
  return redis.error_reply('ERR renew_batch: the runs cover ' .. i .. ' of ' .. n .. ' keys')
end
return failed
