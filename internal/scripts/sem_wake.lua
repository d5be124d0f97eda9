-- sem_wake: passes on the permits that an uncontended release (a plain
-- HDEL, see quick.go) freed while somebody queued, as sem_release.lua would
-- have done.
--
-- KEYS = holders H, fence counter, queue, size S (see sem.lua).
-- ARGV = the node's publish command (see queue.lua).
-- Returns 2 handed to the queue; 1 otherwise.

--#include queue.lua
--#include sem.lua

local size = stored_size()
if not size then return 1 end
local total = held(true)
if total and grant_sem(total, size) > 0 then return 2 end
return 1
