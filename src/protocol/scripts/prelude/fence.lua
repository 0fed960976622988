-- The fence: fencing tokens strictly rising per name. Every script that issues a token, or reads
-- or raises a mark, does it through the items below, and nothing else writes a mark.
--
-- A token is a number of microseconds. Each hash slot has a mark, `P{#N}:fence`, shared by every
-- lock type and name of the slot: a plain number (a token), or, written by the Mutex function
-- library on a busy slot, a reservation 'S|US|X|NONCE' (see `take_token`). Its reach
-- (`reach`) is the highest token it covers.
--
-- THE INVARIANT: a slot's mark reaches every token issued on the slot (every grant's token and
-- hand-off block; with a quorum, every token a holder reported to this master). A grant takes
-- a token above the reach and leaves the mark reaching its last token, so tokens strictly rise
-- per name whatever the server clock does: the clock only chooses the token when it is above
-- the reach (after a step back, grants take the reach + 1 until the clock passes it).
--
-- The invariant holds while the mark is kept. A mark lost while the server runs (DEL,
-- FLUSHALL, eviction) is covered, for the Mutex function library's grants on the slots it
-- remembers, by its memory (`take_token`). Otherwise (other grants; an empty restart or a
-- failover, which lose the memory too) the next token is the clock's, which is above every
-- earlier token unless one of them led the clock (a hand-off block, up to MAX_BLOCK; a
-- reservation, up to RESERVE more; a grant after a step back; a quorum token from a master
-- whose clock is ahead) by more than the time since.

-- The highest token a mark's value `m` (GET's reply, or nil) reaches: its digits, or, for a
-- reservation 'S|US|X|NONCE', the clock's token at S, US plus X; 0 for none, or for a value
-- of no form.
local function reach(m)
  if not m then
    return 0
  end
  local n = tonumber(m)
  if n then
    return n
  end
  local s, us, x = string.match(m, '^(%d+)|(%d+)|(%d+)|')
  if not s then
    return 0
  end
  return s * 1000000 + us + x
end

-- A new token on the slot whose mark is the key `mark`, at the server clock `t` (TIME's reply),
-- with up to `block` (0..=MAX_BLOCK) tokens after it for local hand-offs. Returns the token,
-- the block granted and whether the token is above the clock's: the clock's token with the
-- whole block when that is above every token issued on the slot, else the highest + 1 with no
-- block (and true); the mark then reaches token + block.
-- Returns nil and the error, with nothing changed, when the mark refuses (an ACL, a key of
-- another type).
--
-- The memory. Run as a function (FCALL), the Mutex acquire has MARKS, kept from call to call
-- in the library's Lua state (nil in a script sent with EVALSHA, whose state keeps nothing).
-- MARKS.at[mark] = c, for every slot it granted on (up to MAX_MARKS): c.last, the last token
-- this library issued on the slot; c.seen, what it last wrote there: on a busy slot (the last
-- grant within RESERVE) a reservation, and c.upto its reach; else c.last's digits, and c.upto =
-- c.last, so that no grant passes the no-write check. A mark that still reads c.seen's digits
-- reaches c.last, whoever wrote them, so the next grant takes c.last without parsing them.
-- NONCE names the Lua state (its clock at its first write), so no other writer writes a
-- reservation c.seen. Proof of the no-write grant below: the mark still equals c.seen, a
-- reservation, so nobody wrote it since this library did (every other writer writes another
-- string: `take_token` a number or its own reservation, `raise_mark` a number over any
-- reservation; a lost mark reads nil); so every token issued on the slot since was issued
-- here, and the highest is c.last; the token is above it and its block within c.upto, which
-- the mark reaches: the invariant holds without a write. Every other grant writes the mark,
-- and takes its token above both the reach it read and c.last: so a lost mark (reads nil)
-- still gives a token above every one this library issued. MAX_MARKS bounds the memory; a
-- slot forgotten costs writes, and a lost mark there is then covered no better than without
-- the memory.
local function take_token(mark, t, block)
  local token = t[1] * 1000000 + t[2]
  local last = token + block
  local c = MARKS and MARKS.at[mark]
  if c and token > c.last and last <= c.upto and redis.pcall('get', mark) == c.seen then
    c.last = last
    return token, block, false
  end
  -- One write: SET ... GET raises the mark and returns the old one, which is below the token
  -- unless the clock went back (or another grant's block or reservation reaches past it).
  -- Digits made with '%d' (a number argument Redis formats with '%.17g', which costs more).
  local new
  local busy = c and token - c.last < RESERVE
  if busy then
    MARKS.nonce = MARKS.nonce or (t[1] .. t[2])
    new = t[1] .. '|' .. t[2] .. '|' .. (last + RESERVE - token) .. '|' .. MARKS.nonce
  else
    new = string.format('%d', last)
  end
  local m = redis.pcall('set', mark, new, 'get')
  if type(m) == 'table' then
    return nil, m
  end
  -- The highest token issued: c.last when the mark is still what this library wrote (a
  -- reservation: nothing else issued since; digits: they are c.last), else the mark's reach,
  -- never below c.last (a lost mark).
  local high
  if c and m == c.seen then
    high = c.last
  else
    high = reach(m)
    if c and high < c.last then
      high = c.last
    end
  end
  local above = high >= token
  if above then
    -- The clock is not above it: the highest + 1, no block.
    token, block, last, busy = high + 1, 0, high + 1, false
    new = string.format('%d', token)
    redis.call('set', mark, new)
  end
  if busy then
    c.seen, c.last, c.upto = new, last, last + RESERVE
  elseif c then
    c.seen, c.last, c.upto = new, last, last
  elseif MARKS then
    -- A slot new to the memory: its last token, so that a lost mark still gives a token above
    -- it; it becomes busy when the next grant comes within RESERVE.
    if MARKS.n >= MAX_MARKS then
      MARKS.at, MARKS.n = {}, 0
    end
    MARKS.n = MARKS.n + 1
    MARKS.at[mark] = {last = last, upto = last, seen = new}
  end
  return token, block, above
end

-- The grant time (S, US, strings) and the token of a new grant without a block at the server
-- clock `t` on the mark `mark`, for the types whose value stores the grant time in place of the
-- token (a FairMutex, an RwLock writer): `t`'s fields when the token is the clock's, else the
-- time of the fence's token. A mark that refuses fails the script, before anything changed.
local function stamp(mark, t)
  local token, err, above = take_token(mark, t, 0)
  if not token then
    error(err)
  end
  if not above then
    return t[1], t[2], token
  end
  -- The time (S, US, as strings) whose clock token is `token`.
  local s, us = math.floor(token / 1000000), token % 1000000
  return string.format('%.0f', s), string.format('%.0f', us), token
end

-- With a quorum of masters: makes the mark at the key `mark` reach `token`, a holder's token
-- (which another master may have issued), so that this master's next grant is above it. A
-- reservation is always rewritten as a plain number (its reach, or the token when higher), so
-- that a function library's memory of it no longer holds and its next grant reads the mark.
-- A mark of another type is left alone.
local function raise_mark(mark, token)
  local m = redis.pcall('get', mark)
  if type(m) == 'table' then
    return
  end
  local n = tonumber(m)
  if n and n >= token then
    return
  end
  redis.call('set', mark, string.format('%.0f', math.max(reach(m), token)))
end
