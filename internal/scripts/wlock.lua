-- wlock: take a read/write lock for writing, raise a write hold's count, or
-- wait in the lock's queue (DistRWMutex.Lock).
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua). ARGV
-- and the reply as acquire.lua's.
local hash, queue = KEYS[1], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

--#include take.lua

local cur = redis.pcall('hget', hash, owner)
if type(cur) == 'table' then
--#include hash_error.lua
end

if have ~= '0' then
  if not cur then return -4 end
  redis.call('hset', hash, owner, want)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return 0
end

--#include queue.lua
--#include rw.lua
--#include enqueue.lua

if fencing ~= '0' then
--#include counter.lua
end

--#include take_hash.lua

if cur then
  -- A resend of an acquire that was applied, or a grant not heard of yet.
  if fencing == '2' then return take(next_fence()) end
  if fencing == '1' then return take(tonumber(redis.call('get', KEYS[2]) or next_fence())) end
  return take(0)
end

--#include place.lua

local bad = prune_readers()
if bad then return bad end
if redis.call('exists', hash) == 0 and redis.call('zcard', R) == 0 then
  local head = redis.pcall('lindex', queue, 0)
  if type(head) == 'table' then
--#include type_error.lua
    return type_error(queue, 'list') or head
  end
  if not head or head == entry or not handoff then
    local f = 0
    if fencing ~= '0' then f = next_fence() end
    return take(f)
  end
end
-- Whoever waits for what is over now gets it (readers at the head while
-- no writer holds, the head writer of a free lock); the caller queues.
grant_rw()
local wait
wait, bad = rw_pttl()
if bad then return bad end
if not entry then return -4 * wait - 1 end
if not there then redis.call('rpush', queue, entry) end
redis.call('pexpire', queue, queue_keep)
return -4 * wait - 2
