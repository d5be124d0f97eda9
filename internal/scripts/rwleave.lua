-- rwleave: a queued waiter of a read/write lock gives up. Removes its entry
-- and releases a grant it received meanwhile (a write hold, or a read hold
-- on the entry's behalf), then lets in whoever waited for what is now over
-- (readers queued behind a writer that left, say).
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua).
-- ARGV = owner, entry, and the node's publish command (see queue.lua). Returns 1 if a
-- grant was released, else 0.
local owner = ARGV[1]
--#include unqueue.lua
if not unqueued then return 0 end

--#include queue.lua
--#include rw.lua

local _, flag = parse_entry(entry)
local released = 0
if is_reader(flag) then
  released = redis.pcall('zrem', R, owner)
else
  released = redis.pcall('hdel', W, owner)
end
if released ~= 1 then released = 0 end
if prune_readers() then return released end
grant_rw()
return released
