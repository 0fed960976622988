-- Release one level of several locks at once, each as release.lua releases it (owner- and
-- acquisition-checked; an outermost level frees the lock whatever the count says, and
-- publishes on its release channel; an inner level counts one down). One round trip, atomic.
--
-- KEYS[2i-1]  lock hash of name i (i = 1..n)
-- KEYS[2i]    its fencing counter (untouched: a set is only taken on a single master, whose
--             counter is never behind; read by a retry)
-- ARGV[1]     request id: unique per release call, the same on a retry of it, so a retry
--             after a lost reply does not release two levels
-- then, per name i, four arguments at ARGV[4i-2] .. ARGV[4i+1]:
--             owner id; release channel; the acquisition the caller's level belongs to (the
--             lock's 'gen'); '1' for an inner level, '0' for the holder's outermost one
-- then, only on the retry of a call whose first attempt failed on the connection, per name i
-- at ARGV[4n+1+i]: for an outermost level, the fencing token of the caller's acquisition ('' for
--             an inner level); see release.lua's ARGV[7]
--
-- Returns {r_1, l_1, ..., r_n, l_n}: per lock, r as release.lua answers (n >= 0 levels left,
-- 0 when freed; -1 no lock; -2 another owner or acquisition; -3 not a locksmith lock; -4 on a
-- retry: released by the first attempt, told as release.lua tells it), and l
-- how many subscribers received its release message (0 when none was published)

local n = #KEYS / 2
local request = ARGV[1]
local out = {}

local function one(i)
  local lock = KEYS[2 * i - 1]
  local owner, channel, gen, inner =
    ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i], ARGV[4 * i + 1]
  -- On a retry: whether the counter, or the grant after the caller's, says the caller's
  -- acquisition was the last one before the lock went (see release.lua).
  local last = ARGV[4 * n + 1 + i]
  local function last_was_mine(counter)
    return last ~= nil and last ~= '' and counter ~= false and counter ~= ''
      and tonumber(counter) == tonumber(last)
  end
  local kind = redis.call('type', lock)['ok']
  if kind == 'none' then
    local freed = last_was_mine(redis.call('get', KEYS[2 * i]))
    local receivers = redis.call('publish', channel, 'released')
    if freed then
      return -4, receivers
    end
    return -1, receivers
  end
  if kind ~= 'hash' then
    return -3, 0
  end
  local f = redis.call('hmget', lock, 'owner', 'count', 'rel', 'gen', 'prev')
  if f[1] == false then
    return -3, 0
  end
  if f[1] ~= owner or f[4] ~= gen then
    if last_was_mine(f[5]) then
      return -4, 0
    end
    return -2, 0
  end
  if f[3] == request then
    return tonumber(f[2]), 0
  end
  if inner == '1' then
    local count = redis.call('hincrby', lock, 'count', -1)
    if count < 1 then
      count = 1
      redis.call('hset', lock, 'count', 1)
    end
    redis.call('hset', lock, 'rel', request)
    return count, 0
  end
  local receivers = redis.call('publish', channel, 'released')
  redis.call('del', lock)
  return 0, receivers
end

for i = 1, n do
  local r, l = one(i)
  out[#out + 1] = r
  out[#out + 1] = l
end
return out
