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
