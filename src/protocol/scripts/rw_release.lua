-- The read-write lock's release of a writer or a reader (rw_write.lua describes the keys and
-- values). The same call serves a retry.
--
-- KEYS     the hold's key (W for the writer, R for a reader), M (its release marker)
-- ARGV[1]  'write' or 'read': which hold
-- ARGV[2]  'GEN|': the hold's acquisition
-- ARGV[3]  'p' (optional): writers of the caller's client wait, queued in the client behind
--          the one that registered (or none registered yet); a release that frees the lock for
--          a writer publishes on `free` whether or not a flag says someone waits
-- Returns 0 released (a retry: released by the first attempt, as the marker shows), -1 not
-- held (the lease ran out, or Redis lost it), -2 another acquisition holds the writer, -3
-- foreign keys.

local read, mine = ARGV[1] == 'read', ARGV[3] == 'p'
local v = redis.pcall('get', KEYS[1])
if type(v) == 'string' and string.sub(v, 1, #ARGV[2]) == ARGV[2] then
  if mine or string.byte(v, -1) > 57 then
    -- Flagged (the value ends in a letter, not a digit): someone waits. Published first: a
    -- server that refuses PUBLISH fails the script before anything changed.
    local flags = string.match(v, '|(%a+)$') or ''
    local root = string.match(KEYS[1], '^(.*:rw)')
    local writers = string.find(flags, 'w', 1, true)
    if read or writers or mine then
      redis.call('publish', root .. ':free', 'free')
    end
    if string.find(flags, 'e', 1, true) or (not writers and string.find(flags, 'd', 1, true)) then
      redis.call('publish', root .. ':open', 'open')
    end
  end
  redis.call('rename', KEYS[1], KEYS[2])
  return 0
end
-- @helpers

local ty
v, ty = string_at(KEYS[1])
if v == nil then
  if not read or ty ~= 'zset' then
    return -3
  end
  -- One of several readers.
  local now = ms_of(redis.call('time'))
  local m, s = find_reader(KEYS[1], ARGV[2])
  if m and s > now then
    redis.call('zremrangebyscore', KEYS[1], '-inf', now)
    -- The last reader frees the lock for a waiting writer.
    local last = redis.call('zcount', KEYS[1], '(' .. now, '(+inf') <= 1
    if last and (mine or redis.call('zscore', KEYS[1], 'w')) then
      redis.call('publish', rw_root(KEYS[1]) .. ':free', 'free')
    end
    if last then
      redis.call('del', KEYS[1])
    else
      redis.call('zrem', KEYS[1], m)
    end
    redis.call('set', KEYS[2], '1', 'px', math.max(s - now, 1))
    return 0
  end
elseif v and not rw_parse(v) then
  return -3
end
-- Gone, or another acquisition's: did the first attempt of this release release it?
local marker = redis.call('get', KEYS[2])
if marker and (read or starts(marker, ARGV[2])) then
  return 0
end
if v and not read then
  return -2
end
return -1
