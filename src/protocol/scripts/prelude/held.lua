-- The Mutex's value (acquire.lua describes it): split, parsed and written by the Mutex
-- scripts.

-- A Mutex value's fields (split at '|') and whether it is flagged: a value ending in 'w' ends
-- in '|w', which is not a field.
local function held_fields(v)
  local w = string.byte(v, -1) == FLAG_W
  if w then
    v = string.sub(v, 1, -3)
  end
  local f, i = {}, 1
  while true do
    local j = string.find(v, '|', i, true)
    if not j then
      f[#f + 1] = string.sub(v, i)
      return f, w
    end
    f[#f + 1] = string.sub(v, i, j - 1)
    i = j + 1
  end
end

-- A held value's fields by name (gen, owner, block, s, us, count, req, rel, the flag w), its
-- token, the token the short form implies and the last token of its block (upto); nil when v
-- is not a held value.
local function parse_held(v)
  if string.byte(v, -1) == FLAG_W and string.byte(v, -2) ~= BAR then
    return nil
  end
  local f, w = held_fields(v)
  if #f ~= 5 and #f ~= 9 then
    return nil
  end
  local s, us, b = tonumber(f[4]), tonumber(f[5]), tonumber(f[3])
  if not s or not us or not b or f[1] == '' then
    return nil
  end
  local h = {gen = f[1], owner = f[2], block = b, s = f[4], us = f[5], w = w,
    implied = s * 1000000 + us, count = 1, req = f[1], rel = ''}
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

-- The long form of a parsed value h.
local function encode_held(h)
  local token = ''
  if h.token ~= h.implied then
    token = string.format('%.0f', h.token)
  end
  local v = table.concat({h.gen, h.owner, h.block, h.s, h.us, h.count, h.req, h.rel, token}, '|')
  if h.w then
    v = v .. '|w'
  end
  return v
end

-- The value of a new acquisition `req` of `owner`, granted at `t` (TIME's reply) with `b`
-- tokens reserved: the short form, or the long form that carries `token` when one is given
-- (a token above the mark, not the clock's; nil or false: none); flagged when `w`.
local function new_held(req, owner, b, t, token, w)
  local v
  if token then
    v = table.concat({req, owner, b, t[1], t[2], 1, req, '', string.format('%.0f', token)}, '|')
  else
    v = table.concat({req, owner, b, t[1], t[2]}, '|')
  end
  if w then
    v = v .. '|w'
  end
  return v
end

-- An inner level's release by the release call `rel` of the value at `key`, split into `f`
-- (flagged when `w`): its count one down, never below 1 (the server counting fewer levels than
-- the holder: its outer levels still hold it), unless `rel` counted it already (a retry).
-- Returns the levels left, or nil when the value's count is not a number.
local function count_down(key, f, w, rel)
  if #f == 5 then
    f[6], f[7], f[8], f[9] = '1', f[1], '', ''
  end
  local count = tonumber(f[6])
  if not count then
    return nil
  end
  if f[8] == rel then
    return count
  end
  count = math.max(count - 1, 1)
  f[6], f[8] = count, rel
  local v = table.concat(f, '|')
  if w then
    v = v .. '|w'
  end
  redis.call('set', key, v, 'keepttl', 'xx')
  return count
end

-- Releases one level of the Mutex at `lock` held by the acquisition `gen` ('GEN|'), as
-- release.lua describes: `marker` is the lock's release marker and channel, `how` the letters
-- of release.lua's ARGV[2], `rel` an inner level's release request id, and `raise` (optional)
-- runs where the lock was freed or found gone, after the retry's check (a quorum's fencing
-- mark); `v` the lock's GET, when the caller read it already. Returns release.lua's code, and
-- how many subscribers received the release message (nil: none was published).
local function release_level(lock, marker, gen, how, rel, raise, v)
  if v == nil then
    v = redis.pcall('get', lock)
  end
  if type(v) == 'table' then
    return -3
  end
  local quiet = string.find(how, 'n', 1, true)
  -- On a retry: whether the first attempt moved this acquisition's value to the marker.
  local function released_before()
    if not string.find(how, 'r', 1, true) then
      return false
    end
    local m = redis.pcall('get', marker)
    return type(m) == 'string' and string.sub(m, 1, #gen) == gen
  end
  if not v then
    -- No lock (gone): waiters are told.
    local before, receivers = released_before(), nil
    if raise then
      raise()
    end
    if not quiet then
      receivers = redis.call('publish', marker, 'released')
    end
    return before and -4 or -1, receivers
  end
  local f, w = held_fields(v)
  if #f ~= 5 and #f ~= 9 then
    return -3
  end
  if string.sub(v, 1, #gen) ~= gen then
    return released_before() and -4 or -2
  end
  if string.find(how, 'i', 1, true) then
    -- One level down (see count_down).
    return count_down(lock, f, w, rel) or -3
  end
  local receivers = nil
  if not quiet and (w or string.find(how, 'p', 1, true)) then
    receivers = redis.call('publish', marker, 'released')
  end
  redis.call('rename', lock, marker)
  if raise then
    raise()
  end
  return 0, receivers
end
