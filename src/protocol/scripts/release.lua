-- Release a Mutex held by one acquisition: its outermost level frees it, an inner level
-- counts down. One round trip, atomic. See acquire.lua for the value and the tokens.
--
-- KEYS[1]  the lock
-- KEYS[2]  the release marker, and the release channel (the same name: keys and channels
--          are separate namespaces)
-- KEYS[3]  only with a quorum of masters: the slot's fencing mark (prelude/fence.lua), raised
--          to ARGV[4]
-- ARGV[1]  'GEN|': the acquisition the caller's guard belongs to, and the separator
-- The common outermost release sends nothing more. Otherwise, each '' where it does not apply:
-- ARGV[2]  how: any of 'i' (an inner level: the caller still holds outer levels of this
--          acquisition), 'r' (the retry of an outermost release whose first attempt failed on
--          the connection: it may have run, its reply lost), 'p' (publish the release even
--          when nobody flagged the lock: the caller's own threads wait, or a quorum) and 'n'
--          (never publish: a quorum acquire undoing a partial grant)
-- ARGV[3]  an inner level's release request id: unique per release call, the same on a retry
--          of it, so that a retry after a lost reply does not release two levels
-- ARGV[4]  with a quorum, the holder's fencing token: the mark is raised to it (`raise_mark`),
--          so that on a quorum of masters the next token exceeds this one even where this
--          master's mark was behind
--
-- An outermost level frees the lock whatever count the value says (levels the server counts
-- beyond the holder's own, an inner release that never arrived or a re-entry whose reply was
-- lost, must not keep it): the value is moved (RENAME, which keeps the remaining expiry) to
-- the marker key, where a retried release finds it. So the marker lives as long as the lease
-- had left, and is gone after an empty restart: a retry is told it released only while it
-- is there.
--
-- Returns 0        freed; nothing published (nobody flagged the lock)
--         {0, r}   freed and published; r: how many subscribers received the message
--                  (PUBLISH's count), so that a client whose own threads wait can tell whether
--                  others listen too
--         n >= 1   an inner level released: n levels are still held
--         -1       no lock: it expired or was deleted (the lease was lost); waiters are told
--         -2       another owner (or another acquisition of this owner) holds it; nothing
--                  was changed
--         -3       the key is not a locksmith lock; nothing was changed
--         -4       (a retry) the first attempt released it: the marker holds this
--                  acquisition's value. Anything else on a retry cannot be told from a loss

-- The fast path: the holder's outermost release, one master. Nothing else runs before it.
local v = redis.pcall('get', KEYS[1])
if #ARGV == 1 and type(v) == 'string' and string.find(v, ARGV[1], 1, true) == 1 then
  -- Publish before the value moves: a server that refuses PUBLISH (an ACL) then fails the
  -- script before anything changed, so the error the caller sees matches the state.
  if string.byte(v, -1) == FLAG_W then
    local r = redis.call('publish', KEYS[2], 'released')
    redis.call('rename', KEYS[1], KEYS[2])
    return {0, r}
  end
  redis.call('rename', KEYS[1], KEYS[2])
  return 0
end

-- @helpers

local function raise_fence()
  local token = tonumber(ARGV[4] or '')
  if #KEYS < 3 or not token or token == 0 then
    return
  end
  raise_mark(KEYS[3], token)
end

local r, receivers = release_level(KEYS[1], KEYS[2], ARGV[1], ARGV[2] or '', ARGV[3], raise_fence, v)
if r == 0 and receivers then
  return {0, receivers}
end
return r
