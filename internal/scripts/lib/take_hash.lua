-- Fragment, pasted where an entry script says --#include take_hash.lua.
-- Reads: the includer's locals hash, owner, want, lease, queue, and entry,
--   prev (enqueue.lua).
-- Defines: take(f).
--
-- Takes the lock held in the hash (acquire.lua's, wlock.lua's writer) with
-- fence token f, leaving the queue.
local function take(f)
  redis.call('hset', hash, owner, want)
  redis.call('pexpire', hash, lease)
  if entry then redis.call('lrem', queue, 1, entry) end
  if prev then redis.call('lrem', queue, 1, prev) end -- (not rewritten yet: see place.lua)
  return f
end
