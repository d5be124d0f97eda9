-- acquire: take the lock, raise a hold's count, or wait in the lock's queue.
--
-- KEYS = hash (owner -> hold count), fence counter, queue (entry -> arrival,
-- server µs), queue:alive (entry -> liveness deadline, server ms); all begin
-- with P{N}, so they share one cluster slot.
-- ARGV = owner, count the caller has, count it wants, lease ms ('0' keeps the
-- TTL), fencing ('0' off, '1' on, '2' always a new token: quorum), wait id
-- ('' for TryLock: never queue), and the two arguments of the slow paths
-- (see queue.lua): starvation threshold and publish command; entry ttl,
-- claim lease and channel prefix.
--
-- Returns {1, fence} granted (or already ours: a resend, or a grant that
-- reached the waiter before its message); {0, pttl} held by another;
-- {2, pttl} held by another and the caller waits in the queue (entry added
-- or its liveness refreshed); {3, 0} the caller's entry, known queued, is
-- gone; {-1, 0} a nested acquire found its hold gone.
--
-- Counts are absolute: applied twice, a call changes nothing the second time.
local hash, queue = KEYS[1], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

--#include take.lua

--#include queue.lua
--#include enqueue.lua

local cur = redis.pcall('hget', hash, owner)
if type(cur) == 'table' then return type_error(hash, 'hash') end

if have ~= '0' then
  -- Nested: the hold must still be ours.
  if not cur then return {-1, 0} end
  redis.call('hset', hash, owner, want)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return {1, 0}
end

if fencing ~= '0' then
  local bad = counter_error()
  if bad then return bad end
end

-- A wait id of '+<id>' says the entry is known queued: if it is gone (it was
-- handed the lock, which ended before the waiter took it, or it expired),
-- the waiter must queue again under a new id, not this one (reply 3).
local entry, known = wait_entry(fencing == '0' and '0' or '1')

if cur then
  -- Our field exists: a resend of an acquire that was applied, or a queue
  -- grant this waiter has not heard of yet. Set the full lease.
  redis.call('hset', hash, owner, want)
  redis.call('pexpire', hash, lease)
  if entry then drop_entry(entry) end
  local f = 0
  if fencing == '2' then
    f = next_fence()
  elseif fencing == '1' then
    f = tonumber(redis.call('get', fence_key) or next_fence())
  end
  return {1, f}
end

if known and not redis.pcall('zscore', alive, entry) then return {3, 0} end

local now = now_us()
-- The hash's TTL answers both questions left: is the lock free (-2), and
-- how long may the caller have to wait.
local pttl = redis.call('pttl', hash)
if pttl == -1 then return no_expiry(hash) end
if pttl == -2 then
  -- Free, with waiters queued.
  local bad = prune(now, true)
  if bad then return bad end
  local head, arrived = queue_head()
  if not head or head == entry or not starving(arrived, now) then
    -- Nobody left, the caller is the head, or normal mode lets it barge.
    -- (The first write must be one Redis refuses when out of memory: after
    -- any write, a script may write on past maxmemory.)
    local f = 0
    if fencing ~= '0' then f = next_fence() end
    redis.call('hset', hash, owner, want)
    redis.call('pexpire', hash, lease)
    if entry then drop_entry(entry) end
    return {1, f}
  end
  -- Starvation mode, and nobody handed it on (the last holder expired):
  -- the head gets it now; the caller queues.
  grant_head(now, true)
  pttl = redis.call('pttl', hash)
end
if pttl < 0 then pttl = 0 end
if not entry then return {0, pttl} end
local bad = enqueue(entry, now, tonumber(ttl))
if bad then return bad end
return {2, pttl}
