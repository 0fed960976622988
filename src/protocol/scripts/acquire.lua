-- Acquire, or re-enter, a Mutex. One round trip, atomic.
--
-- KEYS[1]  the lock: one string (see "The value" below), expiring with the lease
-- KEYS[2]  the fencing mark of the name's hash slot `P{#N}:fence` (src/protocol/keys.rs): the
--          highest token any grant of a name of that slot issued or reserved (see "Tokens"), or
--          a function library's reservation (see "The memory"); with a quorum of masters also
--          raised by renewals and releases (see "Quorum")
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
-- The value, held:  GEN|OWNER|B|S|US                       (short form: a fresh grant)
--                   GEN|OWNER|B|S|US|COUNT|REQ|REL|TOKEN   (long form)
-- S and US are the server clock at the grant (TIME, as it came). The short form implies count
-- 1, req = GEN, rel = '' and token = S * 1000000 + US + LEAD; in the long form an empty TOKEN
-- is that implied one. Either form may end in '|w': someone waits, so the release publishes.
-- The last byte is 'w' exactly then (US and TOKEN are digits or empty). Every held form
-- implies upto = token + B.
-- The value, free:  #C  a tombstone, with a short expiry: tokens up to C were issued, so the
--                   next grant's token exceeds C (release.lua writes it when it must).
--
-- Tokens. A grant's token is the server clock in microseconds + LEAD, unless the slot's mark
-- (KEYS[2]) says that a token that high was already issued or reserved: then it is the mark + 1,
-- and the grant reserves no hand-off block. Every grant raises the mark to its last token (its own
-- + its block). So tokens strictly rise per name whatever the server clock does: a clock stepped
-- back (an NTP step, a VM restored from a snapshot) only makes grants take the mark + 1 until the
-- clock passes it again. A grant without the memory (below) costs one more command and no read:
-- SET ... GET raises the mark and returns the old one, which is below the new token unless the
-- clock went back (or another name of the slot was granted within its block's microseconds): then
-- the slow path grants again above it, over the value just set. The mark is one key per hash slot
-- (at most 16,384), so it needs no expiry. Without it (an empty restart), the next token is the
-- clock + LEAD: above every earlier one as long as the clock did not go back in between (a restart
-- takes more than MAX_BLOCK + RESERVE microseconds). LEAD (1 s + MAX_BLOCK) keeps these tokens
-- above those of clients of the layout before, whose counters led the clock by at most that; both
-- come from the Rust constants (the generated header, src/protocol/lua.rs), as the value's flag
-- and separator bytes FLAG_W and BAR do. A hold whose hand-off run issued tokens faster than the
-- clock moved may still leave a tombstone (release.lua); a grant over a tombstone C (or over an
-- orphan whose block ends at C) takes its token above C too.
--
-- The memory. Run as a function (FCALL), this script has MARKS: what the library last wrote to
-- each busy slot's mark, kept from call to call in its Lua state (a script sent with EVALSHA
-- keeps nothing: MARKS is nil there). A busy slot's mark is then a reservation, the string
-- 'S|US|X|NONCE': it covers every token up to the clock's token at S, US plus X (the grant's
-- block + RESERVE), and NONCE names the Lua state that wrote it (its clock at its first write).
-- A grant on that slot reads the mark (GET) instead of writing it: when the mark is still the
-- very string the library wrote, no grant but the library's happened on the slot since (every
-- other writer of a mark writes another string, and marks only rise); when also the clock's
-- token is above every token the library issued there (a step back is seen here) and the
-- grant's last token lies within the reservation, the grant needs no write. Otherwise the
-- mark is written as above: a new reservation when the slot's last grant was within RESERVE
-- (busy), else the last token. Every reader of a mark takes a reservation for its reach
-- (mark_value), so a grant without the memory lands above all the library may have issued: up
-- to RESERVE above the clock, and until the clock passes that, the slot's grants take the
-- mark + 1 (the slow path). A lost memory (a restart, a failover, FUNCTION FLUSH, more than
-- MAX_MARKS slots) is rebuilt from the mark, which always covers what was issued.
--
-- Quorum. With a quorum of masters the mark is also the counter that releases and renewals
-- raise to the holder's token, so a token is above every token a majority has seen, whatever
-- the masters' clocks say (no block is reserved there).

-- The fast path: a free lock. Nothing else runs before it. The new value is the short form
-- (flagged when the caller waited); the grant needs the mark to cover its last token (its own
-- + its block), and the old mark to lie below its token, else (the clock went back) the slow
-- path grants again above it.
local t = redis.call('time')
local above = nil
if #ARGV < 5 or ARGV[5] == 'w' then
  local v = ARGV[1] .. '|' .. t[1] .. '|' .. t[2]
  if ARGV[5] == 'w' then
    v = v .. '|w'
  end
  if redis.call('set', KEYS[1], v, 'nx', 'px', ARGV[2]) then
    local token = t[1] * 1000000 + t[2] + LEAD
    -- The block: the request's last field, at most 4 digits (the slow path checks the rest).
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
    end
    local last = token + b
    local c = MARKS and MARKS.at[KEYS[2]]
    if c and token > c.last and last <= c.upto and redis.pcall('get', KEYS[2]) == c.seen then
      -- The memory holds (see "The memory"): the mark is this library's reservation, it
      -- covers this grant, and no grant issued this token yet.
      c.last = last
      return token
    end
    -- The mark: the last token (a number argument reaches Redis as its integer digits, never
    -- `1.7e+15`), or, on a busy slot of a function library, a reservation it remembers.
    local mark = last
    local busy = c and token - c.last < RESERVE
    if busy then
      MARKS.nonce = MARKS.nonce or (t[1] .. t[2])
      mark = t[1] .. '|' .. t[2] .. '|' .. (last + RESERVE - token) .. '|' .. MARKS.nonce
    end
    local m = redis.pcall('set', KEYS[2], mark, 'get')
    if type(m) == 'table' then
      -- Refused (an ACL), or a key of another type at the mark: nothing granted, say why.
      redis.call('del', KEYS[1])
      return m
    end
    local old = m and tonumber(m)
    if m and not old then
      -- A reservation: the clock's token at S, US, plus X ('S|US|X|NONCE'); else no mark.
      local s, us, x = string.match(m, '^(%d+)|(%d+)|(%d+)|')
      old = s and s * 1000000 + us + LEAD + x or 0
    end
    -- Granted when the old mark lies below the token, or when it is still this library's
    -- reservation and the token lies above all it issued (the block reached past it).
    if not old or old < token or (c and m == c.seen and token > c.last) then
      if busy then
        c.seen, c.last, c.upto = mark, last, last + RESERVE
      elseif c then
        c.seen, c.last, c.upto = nil, last, last
      elseif MARKS and old and token - old < RESERVE then
        -- A busy slot new to the memory (its last grant, by anyone, was a moment ago).
        if MARKS.n >= MAX_MARKS then
          MARKS.at, MARKS.n = {}, 0
        end
        MARKS.n = MARKS.n + 1
        MARKS.at[KEYS[2]] = {last = last, upto = last}
      end
      return token
    end
    -- The mark is at or above this token (the clock went back, or a grant without the
    -- memory took a reservation's reach): the slow path grants above it, over this value.
    above = old
  end
end

-- @helpers

local now = t[1] * 1000000 + t[2]
local req, owner, block = string.match(ARGV[1], '^([^|]+)|([^|]+)|(%d+)$')
if not req then
  return redis.error_reply('ERR acquire: a malformed request')
end
block = math.min(tonumber(block), MAX_BLOCK)
local flagged = ARGV[5] == 'w'
local live = ARGV[3] or ''

-- A new acquisition, above `floor` (the last token a tombstone or an orphan says was issued;
-- nil: none) and above the name's mark, flagged when `w`; raises the mark.
local function grant(floor, w)
  local token, b = now + LEAD, block
  local m = mark_value(redis.call('get', KEYS[2]))
  if not floor or m > floor then
    floor = m
  end
  local explicit = nil
  if floor >= token then
    token, b = floor + 1, 0
    explicit = token
  end
  redis.call('set', KEYS[1], new_held(req, owner, b, t, explicit, w), 'px', ARGV[2])
  redis.call('set', KEYS[2], token + b)
  return {1, token, 1, req, token + b}
end

if above then
  -- The fast path took the free lock, but its token was not above the mark: grant above it.
  return grant(above, flagged)
end

local v = redis.pcall('get', KEYS[1])
if type(v) == 'table' then
  -- Not a string. A hash with an owner is a lock of the layout before this one (a client not
  -- upgraded yet holds it): busy, so that both kinds of client still exclude each other.
  if old_layout(KEYS[1]) then
    return {0, redis.call('pttl', KEYS[1])}
  end
  return {-1}
end
if not v then
  return grant(nil, flagged)
end
if string.byte(v, 1) == TOMB then
  local c = tonumber(string.sub(v, 2))
  if not c then
    return {-1}
  end
  return grant(c, flagged)
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
  if h.gen == req then
    extend(KEYS[1], ARGV[2])
  else
    extend(KEYS[1], ARGV[4])
  end
  return {1, h.token, h.count, h.gen, h.upto}
end
if live == '' or h.gen ~= live then
  -- Orphaned levels of this owner: replaced by a new acquisition above their block; whoever
  -- waited for them waits for the new one.
  return grant(h.upto, flagged or h.w)
end
h.count = h.count + 1
h.req = req
redis.call('set', KEYS[1], encode_held(h), 'keepttl', 'xx')
extend(KEYS[1], ARGV[4])
return {1, h.token, h.count, h.gen, h.upto}
