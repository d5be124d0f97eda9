-- The caller's place in the queue (see queue.lua), for the scripts that
-- acquire or queue (acquire, rlock, wlock). ARGV[6] is its entry: '' for
-- none (TryLock: never queued), '+<entry>' once the caller knows it queued.

-- How long the queue lives after a write: maxQueueTTL (mutex.go). A
-- waiter refreshes its entry every third of that, so the queue outlives
-- its live waiters and goes with the last of them.
local queue_keep = '750'

local entry, known = ARGV[6], false
if string.byte(entry) == 43 then -- '+'
  entry, known = string.sub(entry, 2), true
elseif entry == '' then
  entry = nil
end

-- An error reply for a key of another type than want (or none), else nil.
local function type_error(key, want)
  local t = redis.call('type', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. key)
  end
  return nil
end
