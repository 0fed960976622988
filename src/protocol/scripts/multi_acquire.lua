-- Acquire, or re-enter, several Mutex locks at once: all of them, or none. One round trip,
-- atomic. Each lock is the very lock acquire.lua takes for its name (the same key, value,
-- tokens and re-entry rules; see there), so a Mutex on one name and a set that includes it
-- exclude each other.
--
-- KEYS[i]     the lock of name i (i = 1..n)
-- KEYS[n+i]   the fencing mark of name i's hash slot (see acquire.lua): a new acquisition's
--             token is above it, and raises it (names of one slot share it)
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
-- clock is read once, so every new acquisition of one call has the same token (tokens are
-- per name).
--
-- Returns {1, token_1, count_1, gen_1, ..., token_n, count_n, gen_n}
--                  every lock is held by its owner now (count 1 and gen = ARGV[2]: newly
--                  acquired; otherwise re-entered)
--         {0, i, pttl}   lock i is held by another owner for pttl more milliseconds;
--                        nothing else changed (the first such lock, in the order of KEYS; it
--                        is flagged, so that its release publishes for the caller)
--         {-1, i}        lock i's key is not a locksmith lock; nothing changed

-- See acquire.lua.
local LEAD = 1000000 + 1024

local n = #KEYS / 2
local request = ARGV[2]
local t = redis.call('time')
local now = t[1] * 1000000 + t[2]

-- The fields of a held value, or nil (as acquire.lua's parse).
local function parse(v)
  local w = string.byte(v, -1) == 119
  if w then
    if string.byte(v, -2) ~= 124 then
      return nil
    end
    v = string.sub(v, 1, -3)
  end
  local f, i = {}, 1
  while true do
    local j = string.find(v, '|', i, true)
    if not j then
      f[#f + 1] = string.sub(v, i)
      break
    end
    f[#f + 1] = string.sub(v, i, j - 1)
    i = j + 1
  end
  if #f ~= 5 and #f ~= 9 then
    return nil
  end
  local s, us, b = tonumber(f[4]), tonumber(f[5]), tonumber(f[3])
  if not s or not us or not b or f[1] == '' then
    return nil
  end
  local h = {gen = f[1], owner = f[2], block = b, s = f[4], us = f[5], w = w,
    implied = s * 1000000 + us + LEAD, count = 1, req = f[1], rel = ''}
  h.token = h.implied
  if #f == 9 then
    h.count, h.req, h.rel = tonumber(f[6]), f[7], f[8]
    if f[9] ~= '' then
      h.token = tonumber(f[9])
    end
    if not h.count or not h.token then
      return nil
    end
  end
  h.upto = h.token + h.block
  return h
end

-- Moves lock i's expiry to at least ms milliseconds from now; never earlier.
local function extend(i, ms)
  ms = tonumber(ms) or 0
  if ms > 0 and redis.call('pttl', KEYS[i]) < ms then
    redis.call('pexpire', KEYS[i], ms)
  end
end

-- First every lock is looked at, and nothing is written unless all of them can be had.
-- plan[i]: {'grant', floor, w}, {'retry', h} or {'enter', h}
local plan = {}
for i = 1, n do
  local owner, live = ARGV[3 * i], ARGV[3 * i + 1]
  local v = redis.pcall('get', KEYS[i])
  if type(v) == 'table' then
    if redis.call('type', KEYS[i])['ok'] == 'hash' and redis.call('hexists', KEYS[i], 'owner') == 1 then
      -- A lock of the layout before this one: busy (see acquire.lua).
      return {0, i, redis.call('pttl', KEYS[i])}
    end
    return {-1, i}
  elseif not v then
    plan[i] = {'grant'}
  elseif string.byte(v, 1) == 35 then
    local c = tonumber(string.sub(v, 2))
    if not c then
      return {-1, i}
    end
    plan[i] = {'grant', c}
  else
    local h = parse(v)
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
      plan[i] = {'grant', h.upto, h.w}
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
    token, count, gen = now + LEAD, 1, request
    local floor = math.max(p[2] or 0, tonumber(redis.call('get', KEYS[n + i]) or '') or 0)
    local v
    if floor >= token then
      token = floor + 1
      v = table.concat({request, owner, 0, t[1], t[2], 1, request, '', string.format('%.0f', token)}, '|')
    else
      v = table.concat({request, owner, 0, t[1], t[2]}, '|')
    end
    if p[3] then
      v = v .. '|w'
    end
    redis.call('set', KEYS[i], v, 'px', ARGV[1])
    redis.call('set', KEYS[n + i], token)
  elseif p[1] == 'retry' then
    -- A retry of this very call: answer as the first time, extend as the first time did.
    local h = p[2]
    if h.gen == request then
      extend(i, ARGV[1])
    else
      extend(i, ext)
    end
    token, count, gen = h.token, h.count, h.gen
  else
    local h = p[2]
    h.count = h.count + 1
    h.req = request
    local tk = ''
    if h.token ~= h.implied then
      tk = string.format('%.0f', h.token)
    end
    local v = table.concat({h.gen, h.owner, h.block, h.s, h.us, h.count, h.req, h.rel, tk}, '|')
    if h.w then
      v = v .. '|w'
    end
    redis.call('set', KEYS[i], v, 'keepttl', 'xx')
    extend(i, ext)
    token, count, gen = h.token, h.count, h.gen
  end
  out[#out + 1] = token
  out[#out + 1] = count
  out[#out + 1] = gen
end
return out
