-- Acquire, or re-enter, a Mutex. One round trip, atomic.
--
-- KEYS[1]  the lock: one string (see "The value" below), expiring with the lease
-- KEYS[2]  the fencing mark of the name's hash slot `P{#N}:fence` (src/protocol/keys.rs): it
--          reaches every token issued on the slot; a new acquisition takes its token from it
--          (`take_token`, prelude/fence.lua, which describes the mark and the memory)
-- ARGV[1]  'REQ|OWNER|B': the request id (unique per acquire call across every client and
--          process, the same on a retry of that call; a new acquisition is named after it,
--          its 'gen'), the owner id (client id and thread; never contains '|'), and how many
--          tokens after its own a new acquisition reserves for local hand-offs (0..=MAX_BLOCK)
-- ARGV[2]  lease in milliseconds of a new acquisition
-- ARGV[3]  the acquisition ('gen') of the caller's live hold on this lock (a re-entry), or
--          '' or absent when it holds none. Levels of this owner under any other acquisition
--          are orphans (a release whose reply was lost, or an acquisition its holder gave up
--          as lost): a new acquisition replaces them instead of counting on top of them
-- ARGV[4]  for a re-entry: the lease in milliseconds the key must have left afterwards (the
--          hold's own lease); the expiry is only ever moved later. '0' or absent leaves it
-- ARGV[5]  'w' (or absent): the caller waited for this lock, so others may wait too; a new
--          acquisition starts flagged, and its release publishes
--
-- Returns token           (an integer) newly acquired: count 1, gen = REQ, and the tokens
--                         token+1 ..= token+B reserved for local hand-offs
--         {1, token, count, gen, upto}
--                         held by OWNER now under acquisition gen (count 1 and gen = REQ:
--                         newly acquired; otherwise re-entered, or a retry answered as the
--                         first time); upto: the last token reserved for local hand-offs
--         {0, pttl}       held by another owner for pttl more milliseconds
--         {-1}            the key is not a locksmith lock; nothing changed
--
-- The value:  GEN|OWNER|B|S|US                       (short form: a fresh grant)
--             GEN|OWNER|B|S|US|COUNT|REQ|REL|TOKEN   (long form)
-- S and US are the server clock at the grant (TIME, as it came). The short form implies count
-- 1, req = GEN, rel = '' and token = S * 1000000 + US; in the long form an empty TOKEN is that
-- implied one. Either form may end in '|w': someone waits, so the release publishes. The last
-- byte is 'w' exactly then (US and TOKEN are digits or empty). Every form implies
-- upto = token + B.
--
-- Tokens come from the fence (prelude/fence.lua, `take_token`): the clock's token with the
-- requested block when that is above every token issued on the slot, else the highest + 1
-- with no block (the long form then carries it). The function library's memory lets most
-- grants of a busy slot skip the mark's write; see there.

-- The fast path: a free lock. Nothing else runs before it. The new value is the short form
-- (flagged when the caller waited); when the fence gives another token or block than the
-- clock's (the clock went back, or another grant reaches past it), the value is rewritten in
-- the long form.
local t = redis.call('time')
local fenced = nil
if #ARGV < 5 or ARGV[5] == 'w' then
  local v = ARGV[1] .. '|' .. t[1] .. '|' .. t[2]
  if ARGV[5] == 'w' then
    v = v .. '|w'
  end
  if redis.call('set', KEYS[1], v, 'nx', 'px', ARGV[2]) then
    -- The block: the request's last field, read as up to 4 digits and kept within
    -- 0..=MAX_BLOCK whatever the field holds (the client sends a number in that range).
    local p, q, r, d = string.byte(ARGV[1], -4, -1)
    local b = d - 48
    if r ~= BAR then
      b = b + (r - 48) * 10
      if q ~= BAR then
        b = b + (q - 48) * 100
        if p ~= BAR then
          b = b + (p - 48) * 1000
        end
      end
    end
    if b < 0 then
      b = 0
    elseif b > MAX_BLOCK then
      b = MAX_BLOCK
    end
    local token, got, above = take_token(KEYS[2], t, b)
    if not token then
      -- Refused (an ACL), or a key of another type at the mark: nothing granted, say why.
      redis.call('del', KEYS[1])
      return got
    end
    if not above then
      return token
    end
    fenced = {token, got}
  end
end

-- @helpers

local req, owner, block = string.match(ARGV[1], '^([^|]+)|([^|]+)|(%d+)$')
if not req then
  return redis.error_reply('ERR acquire: a malformed request')
end
block = math.min(tonumber(block), MAX_BLOCK)
local flagged = ARGV[5] == 'w'
local live = ARGV[3] or ''

if fenced then
  -- The fast path granted above the clock's token (or without the block): the long form.
  local token, b = fenced[1], fenced[2]
  redis.call('set', KEYS[1], new_held(req, owner, b, t, token, flagged), 'keepttl')
  return {1, token, 1, req, token + b}
end

-- A new acquisition, flagged when `w`; its token and block from the fence.
local function grant(w)
  local token, b, above = take_token(KEYS[2], t, block)
  if not token then
    return b
  end
  -- The long form carries the token when it is not the clock's.
  redis.call('set', KEYS[1], new_held(req, owner, b, t, above and token, w), 'px', ARGV[2])
  return {1, token, 1, req, token + b}
end

local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then
  return {-1}
end
if not v then
  return grant(flagged)
end
local h = parse_held(v)
if not h then
  return {-1}
end
if h.owner ~= owner then
  -- The caller will wait for the release: flag the value so that the release publishes.
  if not h.w then
    redis.call('set', KEYS[1], v .. '|w', 'keepttl', 'xx')
  end
  return {0, redis.call('pttl', KEYS[1])}
end
if h.req == req then
  -- A retry of this very call: answer as the first time (a retried grant with its block),
  -- and extend as the first time did (the caller's clock starts the lease at the retry).
  extend(KEYS[1], h.gen == req and ARGV[2] or ARGV[4])
  return {1, h.token, h.count, h.gen, h.upto}
end
if live == '' or h.gen ~= live then
  -- Orphaned levels of this owner: replaced by a new acquisition (the mark reaches their
  -- block); whoever waited for them waits for the new one.
  return grant(flagged or h.w)
end
h.count = h.count + 1
h.req = req
redis.call('set', KEYS[1], encode_held(h), 'keepttl', 'xx')
extend(KEYS[1], ARGV[4])
return {1, h.token, h.count, h.gen, h.upto}
