-- The free path of a lock held in a hash (a DistMutex, a DistRWMutex's
-- writer), first in its script with nothing built before it: the hash and
-- every key after the fence counter (the queue; a read/write lock's readers)
-- missing. A fence counter that cannot be incremented falls through to the
-- slow path, which names the key.
if ARGV[2] == '0' and redis.call('exists', KEYS[1], unpack(KEYS, 3)) == 0 then
  local f = 0
  if ARGV[5] ~= '0' then
    f = redis.pcall('incr', KEYS[2])
    if f == 1 then
      -- No counter (first use, or Redis lost it): seed it from the server
      -- clock in µs, so tokens keep rising across a restart.
      local t = redis.call('time')
      local seed = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
      redis.call('set', KEYS[2], seed)
      f = tonumber(seed)
    end
  end
  if type(f) == 'number' then
    redis.call('hset', KEYS[1], ARGV[1], ARGV[3])
    redis.call('pexpire', KEYS[1], ARGV[4])
    return {1, f}
  end
end
