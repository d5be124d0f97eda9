-- quick_lock: the free path of acquire.lua alone, for a lock its Client has
-- not seen contended lately. Redis pays about as much per argument of a
-- script call, and per table it returns, as per command the script runs: so
-- this call passes only the keys it reads and the two arguments it writes,
-- and answers a number. Anything but a free lock is left to acquire.lua.
--
-- KEYS = hash, queue (see acquire.lua), and the fence counter WithFencing.
-- ARGV = owner, lease ms.
-- Returns the fence token (0 without fencing) when the hash and the queue
-- were missing and the owner's count is now 1; -1 otherwise, having written
-- nothing (a fence token may be spent).
--
-- (Each KEYS[i] or ARGV[i] a script reads costs Redis a few hundred
-- instructions: the hash's name is read once.)
local hash, fence_key = KEYS[1], KEYS[3]
if redis.call('exists', hash, KEYS[2]) ~= 0 then return -1 end
local f = 0
if fence_key then
  f = redis.pcall('incr', fence_key)
  if type(f) ~= 'number' then return -1 end -- acquire.lua names the error
--#include seed.lua
end
redis.call('hset', hash, ARGV[1], '1')
redis.call('pexpire', hash, ARGV[2])
return f
