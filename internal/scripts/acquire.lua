-- acquire: take the lock, raise a hold's count, or wait in the lock's queue.
--
-- KEYS = hash (owner -> hold count), fence counter, queue (see queue.lua);
-- all begin with P{N}, so they share one cluster slot.
-- ARGV = owner, count the caller has, count it wants, lease ms ('0' keeps the
-- TTL), fencing ('0' off, '1' on, '2' always a new token: quorum), queue
-- entry ('' for TryLock: never queue; see enqueue.lua), and the node's
-- publish command (see queue.lua).
--
-- Returns one integer (a table costs redis-server more to answer): the fence
-- token (0 without fencing) when granted, or already ours (a resend, or a
-- grant that reached the waiter before its message); else -(4 * pttl +
-- code) - 1 with pttl the holder's remaining lease in ms and code 0 held by
-- another, 1 held by another and the caller waits in the queue (entry added
-- or kept), 2 the caller's entry, known queued, is gone, 3 a nested acquire
-- found its hold gone.
--
-- Counts are absolute: applied twice, a call changes nothing the second time.
local hash, queue = KEYS[1], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if have ~= '0' then
  -- Nested: the hold must still be ours.
  local cur = redis.pcall('hget', hash, owner)
  if type(cur) == 'table' then
--#include hash_error.lua
  end
  if not cur then return -4 end
  redis.call('hset', hash, owner, want)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return 0
end

-- The hash's TTL answers the first questions: is the lock free (-2), and
-- how long may the caller have to wait.
local pttl = redis.call('pttl', hash)
if pttl == -2 and redis.call('exists', queue) == 0 then
  -- Free, and nobody queued. (A fence counter that cannot be incremented
  -- falls through to the slow path, which names the key.)
  local f = 0
  if fencing ~= '0' then
    local fence_key = KEYS[2]
    f = redis.pcall('incr', fence_key)
--#include seed.lua
  end
  if type(f) == 'number' then
    redis.call('hset', hash, owner, want)
    redis.call('pexpire', hash, lease)
    return f
  end
end

local cur = false
if pttl ~= -2 then
  cur = redis.pcall('hget', hash, owner)
  if type(cur) == 'table' then
--#include hash_error.lua
  end
end

--#include enqueue.lua

if fencing ~= '0' then
--#include counter.lua
end

if cur then
  -- Our field exists: a resend of an acquire that was applied, or a queue
  -- grant this waiter has not heard of yet. Set the full lease.
--#include take_hash.lua
  if fencing == '0' then return take(0) end
--#include fence.lua
  if fencing == '2' then return take(next_fence()) end
  return take(tonumber(redis.call('get', KEYS[2]) or next_fence()))
end

--#include place.lua

if pttl == -1 then
  -- remutex never leaves a hold without expiry: something else wrote it.
  local o = redis.call('hkeys', hash)[1] or ''
  return redis.error_reply('NOEXPIRY remutex ' .. #hash .. ' ' .. hash .. ' ' .. o)
end
if pttl == -2 then
  -- Free, with waiters queued (the last holder's lease ran out, or the
  -- wake.lua of its release has not run yet). The queue's head is owed it:
  -- it gets it now and the caller queues, unless the caller is the head,
  -- or nobody takes it (or a quorum, whose waiters race for it).
--#include pub.lua
  local head = redis.pcall('lindex', queue, 0)
  if type(head) == 'table' then
--#include type_error.lua
    return type_error(queue, 'list') or head
  end
  local granted = 1
  if handoff and head and head ~= entry then
--#include grant.lua
  end
  if granted ~= 2 then
    local f = 0
    if fencing ~= '0' then
--#include fence.lua
      f = next_fence()
    end
--#include take_hash.lua
    return take(f)
  end
  pttl = redis.call('pttl', hash)
  if pttl < 0 then pttl = 0 end
end
if not entry then return -4 * pttl - 1 end
if not there then redis.call('rpush', queue, entry) end
redis.call('pexpire', queue, queue_keep)
return -4 * pttl - 2
