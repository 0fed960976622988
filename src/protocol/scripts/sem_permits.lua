-- The leased semaphore: every acquisition of permits is a lease of its own. Atomic, one round
-- trip per operation.
--
-- KEYS[1]  holders: a hash, acquisition id -> number of permits it holds
-- KEYS[2]  leases: a sorted set, acquisition id -> lease deadline in server milliseconds
-- KEYS[3]  release only: the release marker of the acquisition (see there)
-- ARGV[1]  operation: 'acquire', 'release', 'renew' or 'used'
-- ARGV[2]  acquisition id (owner id .. '/' .. request id of the acquire call)
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  release channel: a release publishes there
--
-- acquire  ARGV[5] permits wanted (n >= 1), ARGV[6] the caller's permit count (limit >= n)
--          Returns {1, 0, n, id}  held by acquisition id = ARGV[2] (also for a retry of the
--                                 same call: nothing is counted twice)
--                  {0, wait}  not enough permits free: the first lease to run out (a dead
--                             holder's) ends in `wait` ms; a release publishes before that
--                  {-1}       the keys hold something locksmith did not write
-- release  ARGV[5] '1' on the retry of a release whose first attempt failed on the connection
--          ARGV[6] how long the release marker lives, in milliseconds: a release writes KEYS[3],
--                  so that its retry tells "my first attempt released it" from "it was gone"
--          Returns 0 released (and published; a retry: by the first attempt), -1 not held (the
--          lease had run out, or Redis lost it), -3 foreign.
-- renew    Returns 1 extended, 0 not held any more.
-- used     Returns the permits held by live leases.
--
-- Leases are measured by the server's clock (TIME) only. Every operation first drops the
-- acquisitions whose lease ran out, so a dead holder's permits come back one lease after its
-- last renewal, whoever asks next.

local now_t = redis.call('time')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local id, lease = ARGV[2], tonumber(ARGV[3])

local t1 = redis.call('type', KEYS[1])['ok']
local t2 = redis.call('type', KEYS[2])['ok']
if (t1 ~= 'none' and t1 ~= 'hash') or (t2 ~= 'none' and t2 ~= 'zset') then
  if ARGV[1] == 'acquire' then
    return {-1}
  end
  if ARGV[1] == 'release' then
    return -3
  end
  return 0
end

-- Drop expired acquisitions.
local dead = redis.call('zrangebyscore', KEYS[2], '-inf', now)
for _, d in ipairs(dead) do
  redis.call('hdel', KEYS[1], d)
  redis.call('zrem', KEYS[2], d)
end

local function used()
  local total = 0
  for _, v in ipairs(redis.call('hvals', KEYS[1])) do
    total = total + (tonumber(v) or 0)
  end
  return total
end

-- Moves the expiry of `key` to at least `lease` ms from now; never earlier. Holders may have
-- leases of different lengths (clients with different settings): a short one must not make
-- the keys, and with them a longer lease's permits, expire early.
local function keep(key)
  if redis.call('pttl', key) < lease then
    redis.call('pexpire', key, lease)
  end
end

local function touch()
  redis.call('zadd', KEYS[2], now + lease, id)
  keep(KEYS[1])
  keep(KEYS[2])
end

if ARGV[1] == 'acquire' then
  local n, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
  local mine = redis.call('hget', KEYS[1], id)
  if mine then
    touch()
    return {1, 0, tonumber(mine), id}
  end
  if used() + n <= limit then
    redis.call('hset', KEYS[1], id, n)
    touch()
    return {1, 0, n, id}
  end
  local first = redis.call('zrange', KEYS[2], 0, 0, 'withscores')
  local wait = lease
  if first[2] then
    wait = math.max(tonumber(first[2]) - now, 1)
  end
  return {0, wait}
end

if ARGV[1] == 'release' then
  if redis.call('hexists', KEYS[1], id) == 0 then
    if ARGV[5] == '1' and redis.call('exists', KEYS[3]) == 1 then
      return 0
    end
    return -1
  end
  -- Publish first: a server that refuses PUBLISH fails the script before anything changed.
  redis.call('publish', ARGV[4], 'released')
  redis.call('hdel', KEYS[1], id)
  redis.call('zrem', KEYS[2], id)
  redis.call('set', KEYS[3], '1', 'px', tonumber(ARGV[6]) or 1)
  return 0
end

if ARGV[1] == 'renew' then
  if redis.call('hexists', KEYS[1], id) == 0 then
    return 0
  end
  touch()
  return 1
end

if ARGV[1] == 'used' then
  return used()
end

return redis.error_reply('unknown semaphore operation')
