-- Fragment, pasted where an entry script says --#include key_error.lua.
-- Reads: the includer's local bad (a key).
-- Defines: nothing; returns from the including script with a WRONGTYPE
--   error reply naming the key.
--
  -- The key holds another type: name it; write nothing.
  local t = redis.call('type', bad)
  if type(t) == 'table' then t = t['ok'] end
  return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. bad)
