-- rwwake: passes on a read/write lock whose last reader left by a plain
-- ZREM (see quick.go) while somebody was queued: whoever waits for what is
-- over now is let in, as runlock.lua would have done.
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua).
-- ARGV = the node's publish command (see queue.lua).
-- Returns 2 handed off, 1 otherwise.

--#include queue.lua
--#include rw.lua

if prune_readers() then return 1 end
return grant_rw()
