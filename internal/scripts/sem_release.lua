-- sem_release: give back permits of one acquisition (DistSemaphore.Release),
-- and pass what is free to the heads of the queue.
--
-- KEYS = holders H, fence counter, queue, size S (see sem.lua).
-- ARGV = owner, permits it keeps ('0': all given back, the holder gone),
-- the lease ms a holding that keeps permits gets from now, as at a renewal
-- ('0': its deadline stays, WithoutRenewal), and the node's publish
-- command (see queue.lua).
-- Returns 0 not held, 1 done, 2 done and permits handed to the queue.
local H, queue = KEYS[1], KEYS[3]
local owner, keep, lease = ARGV[1], ARGV[2], ARGV[3]

local v = redis.pcall('hget', H, owner)
if type(v) ~= 'string' then return 0 end
if keep == '0' then
  redis.call('hdel', H, owner)
else
  -- The holding's deadline, as the caller counts it, moves to now + lease
  -- (a lone holder's is H's expiry); its fencing token stays.
  local d, f = string.match(v, '^%d+:?(%d*)(,?%d*)$')
  if not d then return 0 end -- no holding (see sem.lua)
  if d ~= '' and lease ~= '0' then
    local t = redis.call('time')
    d = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(lease))
  end
  if d ~= '' then d = ':' .. d end
  redis.call('hset', H, owner, keep .. d .. f)
  if lease ~= '0' and redis.call('pttl', H) < tonumber(lease) then redis.call('pexpire', H, lease) end
end
if redis.call('exists', queue) == 0 then return 1 end

--#include queue.lua
--#include sem.lua

local size = stored_size()
if not size then return 1 end
local total = held(true)
if total and grant_sem(total, size) > 0 then return 2 end
return 1
