-- Fragment, pasted where an entry script says --#include take.lua.
-- Reads: KEYS (hash, fence counter, queue, ...), ARGV[1..5] (owner, have,
--   want, lease, fence mode); includes seed.lua.
-- Defines: nothing; returns the fence token from the including script when the
--   lock is free, else falls through.
--
-- The free path of a lock held in a hash (a DistMutex, a DistRWMutex's
-- writer), first in its script with nothing built before it: the hash and
-- every key after the fence counter (the queue; a read/write lock's readers)
-- missing. A fence counter that cannot be incremented falls through to the
-- slow path, which names the key. Returns the fence token (0 without
-- fencing): granted.
if ARGV[2] == '0' and redis.call('exists', KEYS[1], unpack(KEYS, 3)) == 0 then
  local f = 0
  if ARGV[5] ~= '0' then
    local fence_key = KEYS[2]
    f = redis.pcall('incr', fence_key)
--#include seed.lua
  end
  if type(f) == 'number' then
    redis.call('hset', KEYS[1], ARGV[1], ARGV[3])
    redis.call('pexpire', KEYS[1], ARGV[4])
    return f
  end
end
