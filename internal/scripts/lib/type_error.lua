-- Fragment, pasted where an entry script says --#include type_error.lua.
-- Reads: nothing.
-- Defines: type_error(key, want).
--
-- An error reply for a key of another type than want (or none), else nil.
-- Included in the error branches that call it, not before: Lua builds a
-- script's functions at every call that reaches their definition.
local function type_error(key, want)
  local t = redis.call('type', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. key)
  end
  return nil
end
