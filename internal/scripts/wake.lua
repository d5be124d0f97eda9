-- wake: passes on a lock whose uncontended final release (a plain HDEL, see
-- quick.go) found somebody queued: the head of the queue is handed the
-- lock, or woken, as release.lua would have done.
--
-- KEYS = hash, fence counter, queue (see acquire.lua).
-- ARGV = the node's publish command (see pub.lua).
-- Returns 2 handed off; 1 otherwise (taken meanwhile by a newcomer, whose
-- release wakes the queue, or nobody left).
local hash, queue = KEYS[1], KEYS[3]
if redis.call('exists', hash) == 1 then return 1 end

--#include pub.lua
local granted = 1
--#include grant.lua
return granted
