-- Extend the lease of a Mutex held by one acquisition. Sent in pipelined batches; see
-- renew_batch.lua for several locks in one call, and acquire.lua for the value.
--
-- KEYS[1]  the lock
-- KEYS[2]  only with a quorum of masters: the slot's fencing mark, raised to ARGV[3]
--          (`raise_mark`, prelude/fence.lua)
-- ARGV[1]  'GEN|': the acquisition being renewed, and the separator
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  with a quorum, the holder's fencing token
--
-- Returns 1  extended
--         0  not held by that acquisition any more (expired, deleted, another owner, or a key
--            of another type); nothing changed

local v = redis.pcall('get', KEYS[1])
if type(v) ~= 'string' or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[2])
if #KEYS == 2 then
  raise_mark(KEYS[2], tonumber(ARGV[3]))
end
return 1
