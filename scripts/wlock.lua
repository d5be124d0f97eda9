-- wlock: take a read/write lock for writing, raise a write hold's count, or
-- wait in the lock's queue (DistRWMutex.Lock).
--
-- KEYS = writer hash W, fence counter, queue, queue:alive, readers R (see
-- rw.lua). ARGV as acquire.lua's, and the same replies: {1, fence} granted,
-- {0, pttl} busy, {2, pttl} busy and queued, {3, 0} the caller's entry,
-- known queued, is gone, {-1, 0} a nested acquire found its hold gone.
local hash, queue = KEYS[1], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

--#include take.lua

--#include queue.lua
--#include rw.lua
--#include enqueue.lua

local cur = redis.pcall('hget', hash, owner)
if type(cur) == 'table' then return type_error(hash, 'hash') end

if have ~= '0' then
  if not cur then return {-1, 0} end
  redis.call('hset', hash, owner, want)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return {1, 0}
end

if fencing ~= '0' then
  local bad = counter_error()
  if bad then return bad end
end

local entry, known = wait_entry(fencing == '0' and 'w' or 'W')

local function take(f)
  redis.call('hset', hash, owner, want)
  redis.call('pexpire', hash, lease)
  if entry then drop_entry(entry) end
  return {1, f}
end

if cur then
  -- A resend of an acquire that was applied, or a grant not heard of yet.
  local f = 0
  if fencing == '2' then
    f = next_fence()
  elseif fencing == '1' then
    f = tonumber(redis.call('get', fence_key) or next_fence())
  end
  return take(f)
end

if known and not redis.pcall('zscore', alive, entry) then return {3, 0} end

local now = now_us()
local bad = prune(now, true) or prune_readers(now_ms(now))
if bad then return bad end
if redis.call('exists', hash) == 0 and redis.call('zcard', KEYS[5]) == 0 then
  local head = queue_head()
  if not head or head == entry or not handoff then
    local f = 0
    if fencing ~= '0' then f = next_fence() end
    return take(f)
  end
end
-- Whoever waits for what is over now gets it (readers at the head while
-- no writer holds, the head writer of a free lock); the caller queues.
grant_rw(now)
local wait
wait, bad = rw_pttl(now)
if bad then return bad end
if not entry then return {0, wait} end
bad = enqueue(entry, now, tonumber(ttl))
if bad then return bad end
return {2, wait}
