-- Extend the leases of several locks in one call, each checked on its own against the very
-- acquisition being renewed. Sent by the renewal thread, several calls to a pipeline; see
-- renew.lua for one lock.
--
-- KEYS[1..n]     the locks (see acquire.lua for the value)
-- KEYS[n+1..2n]  their slots' fencing marks (prelude/fence.lua), in the same order; only when
--                ARGV[1] is '1'
-- ARGV[1]        '1': raise each mark to its holder's token (a quorum of masters,
--                `raise_mark` in prelude/fence.lua); '0': leave the marks alone (a single
--                master), and pass no mark keys
-- ARGV[2]        g, the number of runs: consecutive locks of one lease
-- ARGV[3..2+2g]  per run: lease in milliseconds, how many locks (of KEYS, in order)
-- then           per lock, in the order of KEYS: 'GEN|', the acquisition being renewed and
--                the separator; then, when ARGV[1] is '1', per lock the holder's fencing token
--
-- The check is one prefix: the value begins with the acquisition's 'gen', which names one
-- acquisition of one owner anywhere (it is the acquiring call's request id, unique across
-- every client and process; see acquire.lua), so a lock whose value begins with the 'GEN|'
-- sent is held by that very acquisition, of that owner: a guard of an earlier acquisition by
-- the same owner, or any other owner, never matches.
--
-- Every argument costs Redis a parse and a Lua string (hashed byte by byte), and every
-- redis.call a command lookup and a reply: so per lock one key, one acquisition, one
-- GETRANGE and one PEXPIREAT, nothing else. GETRANGE reads only the value's first #'GEN|'
-- bytes: the reply is then the very string sent when the check passes (Lua keeps one copy of
-- equal strings, so it allocates nothing and compares one pointer), where a GET would bring
-- the whole value back as a new Lua string, cut and hashed again to compare (callgrind: 11 %
-- fewer instructions per lock, benches/callgrind/renew-variants.sh). The lease is set as an absolute time (PEXPIREAT, what
-- PEXPIRE turns into anyway) from the server clock read once per call: a lease then starts
-- at the start of the call, earlier than a PEXPIRE would by at most the call's run time so
-- far (well under a millisecond), and still after the client sent it, which is when the
-- client starts counting it.
--
-- Returns the positions (1-based, in the order of KEYS) of the locks NOT extended: not held by
-- that acquisition any more (expired, deleted, another acquisition, or a key of another
-- type); nothing changed for those. Every other lock was extended. Usually empty.
--
-- One call covers at most a few hundred locks (the caller's bound), so that Redis is never
-- busy with one call for long.

local fence = ARGV[1] == '1'
local runs = tonumber(ARGV[2]) or -1
local n = fence and #KEYS / 2 or #KEYS
local gens = 2 + 2 * runs
if runs < 0 or n ~= math.floor(n) or #ARGV ~= gens + n * (fence and 2 or 1) then
  return redis.error_reply('ERR renew_batch: ' .. #KEYS .. ' keys and ' .. #ARGV
    .. ' arguments do not match')
end
local tokens = gens + n
local call, pcall = redis.call, redis.pcall
local now = call('time')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

local failed = {}
-- GETRANGE's last byte for each length of 'GEN|' met, as a string: a number passed to
-- redis.call would be formatted per lock.
local last = {}
local i = 0
for r = 1, runs do
  local a = 1 + 2 * r
  local lease, count = tonumber(ARGV[a]), tonumber(ARGV[a + 1]) or 0
  if not lease or lease < 1 or i + count > n then
    return redis.error_reply('ERR renew_batch: a bad lease, or runs covering more than '
      .. n .. ' keys')
  end
  -- Formatted once per run: a number passed to redis.call would be formatted per lock.
  local at = string.format('%.0f', now_ms + lease)
  for _ = 1, count do
    i = i + 1
    local g = ARGV[gens + i]
    local e = last[#g]
    if not e then
      e = tostring(#g - 1)
      last[#g] = e
    end
    -- pcall: a key of another type answers WRONGTYPE (an error table, never equal to g),
    -- which must not fail the other locks; a missing key answers '' and a shorter value
    -- less than #g bytes, neither equal to g.
    if pcall('getrange', KEYS[i], '0', e) == g then
      call('pexpireat', KEYS[i], at)
      if fence then
        -- A mark of another type is left alone, and does not fail the other locks.
        raise_mark(KEYS[n + i], tonumber(ARGV[tokens + i]))
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
