-- quick_runlock: the final release of runlock.lua when nobody waits, alone,
-- for a read/write lock its Client has not seen contended lately (see
-- quick_lock.lua).
--
-- KEYS = readers R, queue. ARGV = owner.
-- Returns 1 done; 0 not held (see release.lua on a resend); -1 somebody
-- waits: nothing is done, and the caller sends runlock.lua.
if redis.call('exists', KEYS[2]) ~= 0 then return -1 end
if redis.pcall('zrem', KEYS[1], ARGV[1]) == 1 then return 1 end
return 0
