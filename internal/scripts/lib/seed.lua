-- Fragment, pasted where an entry script says --#include seed.lua.
-- Reads: the includer's locals f (the counter's value after INCR) and
--   fence_key.
-- Defines: nothing new; sets f (and the counter) from the server's clock when
--   the counter was missing.
--
  if f == 1 then
    -- No counter (first use, or Redis lost it): seed it from the server
    -- clock in µs, so tokens keep rising across a restart.
    local t = redis.call('time')
    local seed = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
    redis.call('set', fence_key, seed)
    f = tonumber(seed)
  end
