-- Fragment, pasted where an entry script says --#include enqueue.lua.
-- Reads: ARGV[6] (the caller's queue entry argument).
-- Defines: queue_keep, entry, known, prev.
--
-- The caller's place in the queue (see queue.lua), for the scripts that
-- acquire or queue (acquire, rlock, wlock, sem_acquire). ARGV[6] is its
-- entry: '' for none (TryLock: never queued); '<entry>' queues it unless it
-- is there; once the caller knows it queued, '+<entry>' or
-- '+<previous>|<entry>': the previous entry (as the latest answered call
-- left it) is replaced by this one in place, which names this call's send
-- time (see entryString in backend.go); a call whose previous call got no
-- answer names the same entry as that call, which it may then find.

-- How long the queue lives after a write: maxQueueTTL (mutex.go). A
-- waiter refreshes its entry every third of that, so the queue outlives
-- its live waiters and goes with the last of them.
local queue_keep = '750'

local entry, known, prev = ARGV[6], false, nil
if string.byte(entry) == 43 then -- '+'
  entry, known = string.sub(entry, 2), true
  local bar = string.find(entry, '|', 1, true)
  if bar then prev, entry = string.sub(entry, 1, bar - 1), string.sub(entry, bar + 1) end
elseif entry == '' then
  entry = nil
end
