-- Acquire, or re-enter, several Mutex locks at once: all of them, or none. One round trip,
-- atomic. Each lock is the very lock acquire.lua takes for its name (the same key, value,
-- tokens and re-entry rules; see there), so a Mutex on one name and a set that includes it
-- exclude each other.
--
-- KEYS[i]     the lock of name i (i = 1..n)
-- KEYS[n+i]   the fencing mark of name i's hash slot (prelude/fence.lua): a new acquisition
--             takes its token from it (names of one slot share it)
-- ARGV[1]     lease in milliseconds of a new acquisition
-- ARGV[2]     request id: unique per acquire call, the same on a retry of that call (see
--             acquire.lua); a new acquisition of any name is named ('gen') after it
-- then, per name i, three arguments at ARGV[3i], ARGV[3i+1], ARGV[3i+2]:
--             the owner id it is taken for (the caller's, or for a re-entry the owner of the
--             caller's live hold); the acquisition of the caller's live hold on it, or ''; for
--             a re-entry, the lease in milliseconds the key must have left afterwards ('0':
--             leave the expiry as it is)
--
-- No hand-off block is reserved: a lock held through a set never passes locally. The server
-- clock is read once, so new acquisitions of one call share the clock's token unless the fence
-- gives one of them a higher one (tokens are per name).
--
-- Returns {1, token_1, count_1, gen_1, ..., token_n, count_n, gen_n}
--                  every lock is held by its owner now (count 1 and gen = ARGV[2]: newly
--                  acquired; otherwise re-entered)
--         {0, i, pttl}   lock i is held by another owner for pttl more milliseconds;
--                        nothing else changed (the first such lock, in the order of KEYS; it
--                        is flagged, so that its release publishes for the caller)
--         {-1, i}        lock i's key is not a locksmith lock; nothing changed

local n = #KEYS / 2
local request = ARGV[2]
local t = redis.call('time')

-- First every lock is looked at, and nothing is written unless all of them can be had.
-- plan[i]: {'grant', w}, {'retry', h} or {'enter', h}
local plan = {}
for i = 1, n do
  local owner, live = ARGV[3 * i], ARGV[3 * i + 1]
  local v = redis.pcall('get', KEYS[i])
  if type(v) == 'table' then
    return {-1, i}
  elseif not v then
    plan[i] = {'grant'}
  else
    local h = parse_held(v)
    if not h then
      return {-1, i}
    end
    if h.owner ~= owner then
      if not h.w then
        redis.call('set', KEYS[i], v .. '|w', 'keepttl', 'xx')
      end
      return {0, i, redis.call('pttl', KEYS[i])}
    end
    if h.req == request then
      plan[i] = {'retry', h}
    elseif live == '' or h.gen ~= live then
      -- Levels of this owner under another acquisition are orphans: replaced.
      plan[i] = {'grant', h.w}
    else
      plan[i] = {'enter', h}
    end
  end
end

local out = {1}
for i = 1, n do
  local owner, ext = ARGV[3 * i], ARGV[3 * i + 2]
  local p = plan[i]
  local token, count, gen
  if p[1] == 'grant' then
    local err, above
    token, err, above = take_token(KEYS[n + i], t, 0)
    if not token then
      return err
    end
    count, gen = 1, request
    redis.call('set', KEYS[i], new_held(request, owner, 0, t, above and token, p[2]), 'px', ARGV[1])
  elseif p[1] == 'retry' then
    -- A retry of this very call: answer as the first time, extend as the first time did.
    local h = p[2]
    extend(KEYS[i], h.gen == request and ARGV[1] or ext)
    token, count, gen = h.token, h.count, h.gen
  else
    local h = p[2]
    h.count = h.count + 1
    h.req = request
    redis.call('set', KEYS[i], encode_held(h), 'keepttl', 'xx')
    extend(KEYS[i], ext)
    token, count, gen = h.token, h.count, h.gen
  end
  out[#out + 1] = token
  out[#out + 1] = count
  out[#out + 1] = gen
end
return out
