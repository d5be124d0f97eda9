-- Fragment, pasted where an entry script says --#include counter.lua.
-- Reads: KEYS[2] (the fence counter); includes type_error.lua.
-- Defines: nothing; returns from the including script with an error reply for
--   a counter that is not an integer.
--
  -- The fence counter must be missing or a string holding an integer.
  local v = redis.pcall('get', KEYS[2])
  if type(v) == 'table' then
--#include type_error.lua
    return type_error(KEYS[2], 'string')
  end
  if v and not string.match(v, '^%-?%d+$') then
    return redis.error_reply('WRONGTYPE remutex non-integer ' .. KEYS[2])
  end
