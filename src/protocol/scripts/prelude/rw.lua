-- The read-write lock's helpers (rw_write.lua describes its keys and values). Those that read
-- KEYS[1] .. KEYS[5] serve the scripts that take the keys W, R, WW, WR, WE in that order;
-- `string_at` and `find_reader` also serve renew_holder.lua for a semaphore's holders.

-- A holder's string or member: its fields GEN, OWNER and its flags ('' none), or nil when it is
-- not one.
local function rw_parse(v)
  local gen, owner, flags = string.match(v, '^([^|]+)|([^|]+)|%d+|%d+|?(%a*)$')
  return gen, owner, flags
end

-- The lock's name with its type, `P{T}:rw`, from any of its keys: its channels' prefix.
local function rw_root(key)
  return string.match(key, '^(.*:rw)')
end

-- A string holder at `key`: its value, or false when missing; nil, and the key's type, when it
-- holds something else.
local function string_at(key)
  local v = redis.pcall('get', key)
  if type(v) == 'table' then
    return nil, redis.call('type', key)['ok']
  end
  return v
end

-- Adds the flag `f` to the flags of the string `v` at `key` (kept expiry).
local function add_flag(key, v, f)
  local _, _, flags = rw_parse(v)
  if flags == '' then
    redis.call('set', key, v .. '|' .. f, 'keepttl', 'xx')
  elseif not string.find(flags, f, 1, true) then
    redis.call('set', key, v .. f, 'keepttl', 'xx')
  end
end

-- Records `id` in the waiting set `key` until a lease from now; the key's expiry only ever
-- moves later (waiters may have leases of different lengths).
local function touch(key, id, now, lease)
  redis.call('zadd', key, now + lease, id)
  extend(key, lease)
end

-- Live entries of the waiting set `key` (expired ones dropped), and the first deadline.
local function waiting(key, now)
  redis.call('zremrangebyscore', key, '-inf', now)
  local first = redis.call('zrange', key, 0, 0, 'withscores')
  if first[2] then
    return redis.call('zcard', key), math.max(tonumber(first[2]) - now, 1)
  end
  return 0, nil
end

-- The readers' sorted set (KEYS[2]): dead readers dropped; the live readers of owners other
-- than `owner`, whether any reader is left, the first reader's lease deadline (server ms, as
-- the set scores it: not a wait), and whether the writers' flag is set.
local function readers(now, owner)
  redis.call('zremrangebyscore', KEYS[2], '-inf', now)
  local all = redis.call('zrange', KEYS[2], 0, -1, 'withscores')
  local others, any, first, flagged = 0, false, nil, false
  for i = 1, #all, 2 do
    if all[i] == 'w' then
      flagged = true
    else
      any = true
      local s = tonumber(all[i + 1])
      first = math.min(first or s, s)
      local _, o = rw_parse(all[i])
      if o ~= owner then
        others = others + 1
      end
    end
  end
  return others, any, first, flagged
end

-- The member of acquisition `gen` ('GEN|') in the sorted set of holders `key` (the readers, or
-- a semaphore's holders), and its deadline.
local function find_reader(key, gen)
  local cursor = '0'
  repeat
    local r = redis.call('zscan', key, cursor, 'match', gen .. '*', 'count', 1000)
    cursor = r[1]
    if r[2][1] then
      return r[2][1], tonumber(r[2][2])
    end
  until cursor == '0'
  return nil
end

-- The live holders at `key`, a string or a sorted set of holders scored by their lease
-- deadlines (a read-write lock's readers, a semaphore's holders), as a flat list of value,
-- lease left in ms; nil when the key holds something else, or a string `valid` refuses.
local function live_holders(key, now, valid)
  local v, ty = string_at(key)
  if v then
    if not valid(v) then
      return nil
    end
    return {v, redis.call('pttl', key)}
  end
  local out = {}
  if v == nil then
    if ty ~= 'zset' then
      return nil
    end
    local all = redis.call('zrangebyscore', key, '(' .. now, '(+inf', 'withscores')
    for i = 1, #all, 2 do
      out[#out + 1] = all[i]
      out[#out + 1] = math.floor(tonumber(all[i + 1]) - now)
    end
  end
  return out
end

-- Whether KEYS[from..to] (waiting sets) are sorted sets or missing.
local function zsets(from, to)
  for i = from, to do
    local ty = redis.call('type', KEYS[i])['ok']
    if ty ~= 'none' and ty ~= 'zset' then
      return false
    end
  end
  return true
end

-- The writer (KEYS[1]) as an acquire by `owner` finds it: true, its value (false: none), how
-- long it keeps the caller out in ms (nil: not at all, it is the caller's own or none) and its
-- GEN; flagged with `f` for the caller when `register`. False when the key is foreign.
local function writer_in_way(owner, f, register)
  local w = string_at(KEYS[1])
  if w == nil then
    return false
  end
  if not w then
    return true, false
  end
  local g, o = rw_parse(w)
  if not g then
    return false
  end
  local wait = nil
  if o ~= owner then
    wait = redis.call('pttl', KEYS[1])
    if register then
      add_flag(KEYS[1], w, f)
    end
  end
  return true, w, wait, g
end

-- After a waiting writer gave up: wake whoever can now proceed (as a release would).
local function wake(now)
  if redis.call('exists', KEYS[1]) == 1 then
    return
  end
  local writers = waiting(KEYS[3], now)
  local r, ty = string_at(KEYS[2])
  local any = r ~= false
  if ty == 'zset' then
    local _, a = readers(now, '')
    any = a
  end
  local root = rw_root(KEYS[1])
  if not any and writers > 0 then
    redis.call('publish', root .. ':free', 'free')
  end
  local eager = waiting(KEYS[5], now)
  local deferring = waiting(KEYS[4], now)
  if eager > 0 or (deferring > 0 and writers == 0) then
    redis.call('publish', root .. ':open', 'open')
  end
end
