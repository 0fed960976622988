-- What an operator reads of a read-write lock, or frees by force (rw_write.lua describes the
-- keys and values). Not on any holder's path.
--
-- KEYS     W, R, WW, WR, WE ('force' takes W, R)
-- ARGV[1]  'info' or 'force'
-- info   Returns {S, US, writer, pttl, readers, waiting}: the server clock (TIME's two fields);
--        the writer's value ('' none) and its TTL in ms; the live readers as a flat list of
--        value, lease left in ms; how many waiting writers and readers are registered. {-1}:
--        foreign keys.
-- force  Frees the writer and every reader, whoever they are, and publishes on both channels.
--        Returns the values removed (as 'info' gives them), or {-1} when the keys are foreign
--        (left alone).

local t = redis.call('time')
local now = ms_of(t)

-- The writer's value ('' none) and the live readers (value, lease left in ms, flat); nil when
-- a key is foreign.
local function holders()
  local w = string_at(KEYS[1])
  local out = live_holders(KEYS[2], now, rw_parse)
  if w == nil or (w and not rw_parse(w)) or not out then
    return nil
  end
  return w or '', out
end

if ARGV[1] == 'info' then
  if not zsets(3, 5) then
    return {-1}
  end
  local w, live = holders()
  if not w then
    return {-1}
  end
  local queued = 0
  for i = 3, 5 do
    queued = queued + redis.call('zcount', KEYS[i], '(' .. now, '+inf')
  end
  return {t[1], t[2], w, redis.call('pttl', KEYS[1]), live, queued}
end

if ARGV[1] == 'force' then
  local w, live = holders()
  if not w then
    return {-1}
  end
  if w ~= '' or #live > 0 then
    local root = rw_root(KEYS[1])
    redis.call('publish', root .. ':free', 'free')
    redis.call('publish', root .. ':open', 'open')
    redis.call('del', KEYS[1], KEYS[2])
  end
  return values_of(live, {w})
end

return redis.error_reply('unknown read-write lock admin operation')
