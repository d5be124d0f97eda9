-- Fragment, pasted where an entry script says --#include fence.lua.
-- Reads: KEYS[2] (the fence counter); includes seed.lua.
-- Defines: next_fence().
--
-- Next fencing token of the counter KEYS[2] (see seed.lua for a missing
-- counter). Included where a slow path needs it.
local function next_fence()
  local fence_key = KEYS[2]
  local f = redis.call('incr', fence_key)
--#include seed.lua
  return f
end
