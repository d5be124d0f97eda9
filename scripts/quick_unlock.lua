-- quick_unlock: the final release of release.lua when nobody waits, alone,
-- for a lock its Client has not seen contended lately (see quick_lock.lua).
--
-- KEYS = hash, queue. ARGV = owner.
-- Returns 1 done; 0 not held (see release.lua on a resend); -1 somebody
-- waits: nothing is done, and the caller sends release.lua.
if redis.call('exists', KEYS[2]) ~= 0 then return -1 end
if redis.pcall('hdel', KEYS[1], ARGV[1]) == 1 then return 1 end
return 0
