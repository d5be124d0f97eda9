-- wunlock: lower a write hold's count, or end it and pass the lock on
-- (DistRWMutex.Unlock). When the writer also holds a read hold (it called
-- RLock under its write hold), that read hold stays: the lock is
-- downgraded, and the readers waiting at the head of the queue enter.
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua).
-- ARGV and replies as runlock.lua's.
local hash, queue = KEYS[1], KEYS[3]
local owner, want = ARGV[1], ARGV[2]

--#include lower.lua
if redis.call('exists', queue) == 0 then return 1 end

--#include queue.lua
--#include rw.lua

if prune_readers() then return 1 end
return grant_rw()
