-- Fragment, pasted where an entry script says --#include hash_error.lua.
-- Reads: KEYS[1] (the lock's hash).
-- Defines: nothing; returns from the including script with a WRONGTYPE error
--   reply naming the key.
--
  -- The lock's hash is a key of another type: name it; write nothing.
  local t = redis.call('type', KEYS[1])
  if type(t) == 'table' then t = t['ok'] end
  return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[1])
