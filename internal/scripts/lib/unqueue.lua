-- Fragment, pasted where an entry script says --#include unqueue.lua.
-- Reads: KEYS[3] (the queue), ARGV[2] (the waiter's entry, or
--   '<entry>|<entry>').
-- Defines: entry, unqueued.
--
-- Removes a waiter's queue entries (KEYS[3]) for the scripts of a waiter
-- that gives up (leave, rwleave, sem_leave): ARGV[2] is its entry, or
-- '<entry>|<entry>' where the latest call, which got no answer, may have
-- rewritten the one before (see enqueue.lua). entry is the latest;
-- unqueued is false for a queue key of another type.
local entry, unqueued = ARGV[2], true
do
  local bar = string.find(entry, '|', 1, true)
  if bar then
    unqueued = type(redis.pcall('lrem', KEYS[3], 1, string.sub(entry, 1, bar - 1))) ~= 'table'
    entry = string.sub(entry, bar + 1)
  end
  unqueued = unqueued and type(redis.pcall('lrem', KEYS[3], 1, entry)) ~= 'table'
end
