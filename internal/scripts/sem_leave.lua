-- sem_leave: a queued waiter gives up (see leave.lua). Removes its entry,
-- gives back permits handed to it meanwhile, and lets the heads behind it
-- that now fit take theirs: a large request that leaves the head of the
-- queue unblocks the smaller ones after it.
--
-- KEYS = holders H, fence counter, queue, size S (see sem.lua).
-- ARGV = owner, entry, and the node's publish command (see queue.lua).
-- Returns 1 if a grant was given back, else 0.
local H, queue = KEYS[1], KEYS[3]
local owner = ARGV[1]
--#include unqueue.lua
if not unqueued then return 0 end
local released = 0
if redis.pcall('hdel', H, owner) == 1 then released = 1 end
if redis.call('exists', queue) == 0 then return released end

--#include queue.lua
--#include sem.lua

local size = stored_size()
if not size then return released end
local total = held(true)
if total then grant_sem(total, size) end
return released
