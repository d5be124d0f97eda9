-- Fragment, pasted where an entry script says --#include lower.lua.
-- Reads: KEYS[1], ARGV[1] (owner), ARGV[2] (count wanted), ARGV[3] (lease).
-- Defines: nothing; returns 0 or 1 from the including script, except for a
--   final release that removed the caller's field, which falls through.
--
-- The first part of a release of a hold kept in a hash (a DistMutex, a
-- DistRWMutex's writer): a nested release sets the count the caller wants
-- (and the lease, unless '0'); a final one removes the caller's field. A
-- key of another type answers an error table: not ours (0).
if ARGV[2] ~= '0' then
  if redis.pcall('hexists', KEYS[1], ARGV[1]) ~= 1 then return 0 end
  redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
  if ARGV[3] ~= '0' then redis.call('pexpire', KEYS[1], ARGV[3]) end
  return 1
end
if redis.pcall('hdel', KEYS[1], ARGV[1]) ~= 1 then return 0 end
