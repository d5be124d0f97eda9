-- sem_acquire: take permits of a semaphore, or wait for them in its queue
-- (DistSemaphore.Acquire). Each acquisition is a holder of its own.
--
-- KEYS = holders H, fence counter, queue, size S (see sem.lua).
-- ARGV = owner, '0', permits wanted, lease ms, fencing ('0' off, '1' on),
-- queue entry ('' for TryAcquire: never queue; see enqueue.lua), size, and
-- the node's publish command (see queue.lua).
-- Returns acquire.lua's replies: the fence token (0 without fencing) when
-- granted (or already ours: a resend, or a grant not heard of yet); else
-- -(4 * wait + code) - 1, wait the ms until a holder's lease ends, code 0
-- busy, 1 queued, 2 the known entry is gone. A size that differs from S's
-- is the error 'SIZE remutex <stored> <key>'.
local H, queue = KEYS[1], KEYS[3]
local owner, want, lease, fencing, size = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[7]

-- The free path first: no holder, nobody queued, the size agreed on (or
-- none yet). Anything else, an error included, is the slow path's.
if redis.call('exists', H, queue) == 0 then
  local s = redis.pcall('get', KEYS[4])
  local f = 0
  if fencing ~= '0' and (s == size or not s) then
    local fence_key = KEYS[2]
    f = redis.pcall('incr', fence_key)
--#include seed.lua
  end
  if type(f) == 'number' and (s == size or not s) then
    if not s then redis.call('set', KEYS[4], size) end
    if f ~= 0 then want = want .. ',' .. string.format('%d', f) end
    redis.call('hset', H, owner, want)
    redis.call('pexpire', H, lease)
    return f
  end
end

--#include enqueue.lua
--#include queue.lua
--#include sem.lua

local stored, bad = stored_size()
if bad then return bad end
if stored and stored ~= tonumber(size) then
  return redis.error_reply('SIZE remutex ' .. stored .. ' ' .. KEYS[4])
end
size = tonumber(size)
-- The size is written (first use, or after a resize) with the first
-- holding or queue entry, never beside foreign data.
local function keep_size()
  if not stored then redis.call('set', KEYS[4], digits(size)) end
end

if fencing ~= '0' then
--#include counter.lua
end

-- A caller that already holds (a resend, or a grant it has not heard of
-- yet) is answered with its holding's own token, its lease renewed.
local cur = redis.pcall('hget', H, owner)
if type(cur) == 'table' then
--#include type_error.lua
  return type_error(H, 'hash') or cur
end
if cur then
  local f = token_of(owner)
  keep_size()
  add_holder(owner, want, lease, f)
  return f
end

--#include place.lua

local total, soonest
total, soonest, bad = held(true)
if bad then return bad end
local head = redis.pcall('lindex', queue, 0)
if type(head) == 'table' then
--#include type_error.lua
  return type_error(queue, 'list') or head
end
if head and head ~= entry and grant_sem(total, size) > 0 then
  -- Heads that fit were served (a holder's lease ran out, or the release
  -- that freed the permits has not passed them on yet): the caller may be
  -- among them, or at the head now.
  if redis.call('hexists', H, owner) == 1 then
    -- Granted a claim: the caller takes it now, for the full lease, as if
    -- it had found it in the free path.
    local f = token_of(owner)
    add_holder(owner, want, lease, f)
    if entry then redis.call('lrem', queue, 1, entry) end
    if prev then redis.call('lrem', queue, 1, prev) end
    return f
  end
  total, soonest = held(false)
  head = redis.call('lindex', queue, 0)
end
if (not head or head == entry) and total + tonumber(want) <= size then
  local f = 0
  if fencing ~= '0' then f = next_fence() end
  keep_size()
  add_holder(owner, want, lease, f)
  if entry then redis.call('lrem', queue, 1, entry) end
  if prev then redis.call('lrem', queue, 1, prev) end -- (not rewritten yet: see place.lua)
  return f
end
local wait = soonest or 0
if not entry then return -4 * wait - 1 end
keep_size()
if not there then redis.call('rpush', queue, entry) end
redis.call('pexpire', queue, queue_keep)
return -4 * wait - 2
