-- rwleave: a queued waiter of a read/write lock gives up. Removes its entry
-- and releases a grant it received meanwhile (a write hold, or a read hold
-- on the entry's behalf), then lets in whoever waited for what is now over
-- (readers queued behind a writer that left, say).
--
-- KEYS = writer hash W, fence counter, queue, queue:alive, readers R (see
-- rw.lua). ARGV = owner, entry, and the two arguments of the slow paths.
-- Returns 1 if a grant was released, else 0.
local owner, entry = ARGV[1], ARGV[2]
if type(redis.pcall('zrem', KEYS[3], entry)) == 'table' then return 0 end
redis.pcall('zrem', KEYS[4], entry)

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
local now = now_us()
if prune(now) or prune_readers(now_ms(now)) then return released end
grant_rw(now)
return released
