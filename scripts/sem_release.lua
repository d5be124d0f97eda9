-- sem_release: give back permits of one acquisition (DistSemaphore.Release),
-- and pass what is free to the heads of the queue.
--
-- KEYS = holders H, fence counter, queue, size S (see sem.lua).
-- ARGV = owner, permits it keeps ('0': all given back, the holder gone),
-- '0', and the node's publish command (see queue.lua).
-- Returns 0 not held, 1 done, 2 done and permits handed to the queue.
local H, queue = KEYS[1], KEYS[3]
local owner, keep = ARGV[1], ARGV[2]

local v = redis.pcall('hget', H, owner)
if type(v) ~= 'string' then return 0 end
if keep == '0' then
  redis.call('hdel', H, owner)
else
  redis.call('hset', H, owner, keep .. (string.match(v, ':%d+$') or ''))
end
if redis.call('exists', queue) == 0 then return 1 end

--#include queue.lua
--#include sem.lua

local size = stored_size()
if not size then return 1 end
local total = held(true)
if total and grant_sem(total, size) > 0 then return 2 end
return 1
