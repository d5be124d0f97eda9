-- leave: a queued waiter gives up. Removes its entry and, if the lock was
-- handed to it in the meantime, releases that grant, so that nobody waits for
-- a holder that does not know it holds.
--
-- KEYS = hash, fence counter, queue, queue:alive (see acquire.lua).
-- ARGV = owner, entry, and the two arguments of the slow paths (see
-- queue.lua). Returns 1 if a grant was released, else 0.
local hash, queue = KEYS[1], KEYS[3]
local owner, entry = ARGV[1], ARGV[2]
if type(redis.pcall('zrem', queue, entry)) == 'table' then return 0 end
redis.pcall('zrem', KEYS[4], entry)
if redis.pcall('hexists', hash, owner) ~= 1 then return 0 end
redis.call('hdel', hash, owner)
if redis.call('exists', hash) == 1 then return 1 end

--#include queue.lua

local now = now_us()
if prune(now) then return 1 end -- a queue key of another type: nobody to wake
grant_head(now, false)
return 1
