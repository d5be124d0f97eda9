-- quick_sem: the free path of sem_acquire.lua alone, for a semaphore its
-- Client has not seen contended lately (see quick_lock.lua), where the
-- size is to be checked: the value's first acquisition, and any of more
-- than one permit. (One permit taken while nobody holds or waits fits any
-- size: the value sends quick_lock.lua for it once its size was found
-- right, which writes the same holding, '1', unless it is fenced.)
--
-- KEYS = holders H, queue, size S (see sem.lua), and the fence counter
-- WithFencing. ARGV = owner, lease ms, size, and the permits unless 1.
-- Returns the fence token (0 without fencing) when nobody held or queued
-- and the size agreed (or was not set yet), the holding now in H (a lone
-- holder's: its deadline is H's expiry); -1 otherwise, having written
-- nothing (a fence token may be spent).
if redis.call('exists', KEYS[1], KEYS[2]) ~= 0 then return -1 end
local s = redis.pcall('get', KEYS[3])
if s and s ~= ARGV[3] then return -1 end -- sem_acquire.lua names the error
local f = 0
local fence_key = KEYS[4]
if fence_key then
  f = redis.pcall('incr', fence_key)
  if type(f) ~= 'number' then return -1 end -- sem_acquire.lua names the error
--#include seed.lua
end
if not s then redis.call('set', KEYS[3], ARGV[3]) end
local v = ARGV[4] or '1'
if f ~= 0 then v = v .. ',' .. string.format('%d', f) end -- (see sem.lua)
redis.call('hset', KEYS[1], ARGV[1], v)
redis.call('pexpire', KEYS[1], ARGV[2])
return f
