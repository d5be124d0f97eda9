-- leave: a queued waiter gives up. Removes its entry and, if the lock was
-- handed to it in the meantime, releases that grant, so that nobody waits for
-- a holder that does not know it holds.
--
-- KEYS = hash, fence counter, queue (see acquire.lua).
-- ARGV = owner, entry, and the node's publish command (see queue.lua). Returns 1 if a
-- grant was released, else 0.
local hash, queue = KEYS[1], KEYS[3]
local owner = ARGV[1]
--#include unqueue.lua
if not unqueued then return 0 end
if redis.pcall('hexists', hash, owner) ~= 1 then return 0 end
redis.call('hdel', hash, owner)
if redis.call('exists', hash) == 1 then return 1 end

--#include pub.lua
local granted = 1
--#include grant.lua
return 1
