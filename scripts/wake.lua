-- wake: passes on a lock whose uncontended final release (a plain HDEL, see
-- quick.go) found somebody queued: the live head of the queue is handed the
-- lock, or woken, as release.lua would have done.
--
-- KEYS = hash, fence counter, queue, queue:alive (see acquire.lua).
-- ARGV = the two arguments of the slow paths (see queue.lua).
-- Returns 2 handed off; 1 otherwise (taken meanwhile by a newcomer, whose
-- release wakes the queue, or nobody left).
if redis.call('exists', KEYS[1]) == 1 then return 1 end

--#include queue.lua

local now = now_us()
if prune(now) then return 1 end -- a queue key of another type: nobody to wake
return grant_head(now, false)
