-- Release one level of several Mutex locks at once, each as release.lua releases it
-- (acquisition-checked; an outermost level frees the lock whatever the count says, moving the
-- value to the release marker, and publishes when the lock is flagged; an inner level counts
-- one down). One round trip, atomic. A set is only taken on a single master: no fencing
-- mark to raise, and no hand-off tokens.
--
-- KEYS[2i-1]  the lock of name i (i = 1..n)
-- KEYS[2i]    its release marker and release channel
-- ARGV[1]     request id of the inner levels: unique per release call, the same on a retry of
--             it, so a retry after a lost reply does not release two levels
-- then, per name i, two arguments at ARGV[2i] and ARGV[2i+1]:
--             'GEN|' (the acquisition the caller's level belongs to, and the separator); how,
--             as release.lua's ARGV[2]: '' (the outermost level), 'i' (an inner level), with
--             'p' (publish even when not flagged: the caller's own threads wait) and 'r' (the
--             retry of a call whose first attempt failed on the connection)
--
-- Returns {r_1, l_1, ..., r_n, l_n}: per lock, r as release.lua answers (0 when freed, n >= 1
-- levels left by an inner level; -1 no lock; -2 another owner or acquisition; -3 not a
-- locksmith lock; -4 on a retry: released by the first attempt, told by the marker), and l
-- how many subscribers received its release message (0 when none was published)

local n = #KEYS / 2
local request = ARGV[1]
local out = {}

for i = 1, n do
  local r, l = release_level(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i], ARGV[2 * i + 1], request)
  out[#out + 1] = r
  out[#out + 1] = l or 0
end
return out
