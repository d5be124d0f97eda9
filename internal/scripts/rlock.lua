-- rlock: take a read/write lock for reading, confirm a read hold (nested),
-- or wait in the lock's queue (DistRWMutex.RLock).
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua). ARGV
-- and the reply as acquire.lua's; the fence of a grant is the latest
-- write's token.
--
-- A read hold is a member of R whose score is its deadline on the server's
-- clock (now + lease, moved on by renewals; 0 for a lone reader, see
-- rw.lua), so that a reader that dies stops blocking writers after its
-- lease although others keep R alive.
local R, queue = KEYS[4], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

-- The free path first: no writer, nobody queued (writer preference: a
-- reader that holds nothing waits behind any waiting writer). A lone
-- reader's deadline is 0, R's expiry (see rw.lua); beside others, the slow
-- path writes it.
if have == '0' and redis.call('exists', KEYS[1], queue, R) == 0 then
  local f = 0
  -- (No counter yet: no write so far, token 0. A key of another type: the
  -- slow path names it.)
  if fencing ~= '0' then f = tonumber(redis.pcall('get', KEYS[2]) or '0') end
  if f then
    redis.call('zadd', R, '0', owner)
    redis.call('pexpire', R, lease)
    return f
  end
end

--#include queue.lua
--#include rw.lua

local cur = redis.pcall('zscore', R, owner)
if type(cur) == 'table' then return prune_readers() end -- a key of another type: named
if cur and not live(cur) then
  -- Past its deadline: no longer a hold, whether or not pruned yet.
  redis.call('zrem', R, owner)
  cur = false
end

if have ~= '0' then
  if not cur then return -4 end
  if lease ~= '0' then add_reader(owner, lease) end
  return 0
end

--#include enqueue.lua

if fencing ~= '0' then
--#include counter.lua
end

local function take()
  add_reader(owner, lease)
  if entry then redis.call('lrem', queue, 1, entry) end
  if prev then redis.call('lrem', queue, 1, prev) end -- (not rewritten yet: see place.lua)
  if fencing ~= '0' then return latest_fence() end
  return 0
end

-- Ours already (a resend, or a grant not heard of yet), or the writer
-- reading under its own write hold: the reader's token is then the
-- writer's, '/r' and a number (see pinnedOwnerLocked).
if cur then return take() end
local writer = owner
local slash = string.find(owner, '/', 1, true)
if slash then writer = string.sub(owner, 1, slash - 1) end
local w = redis.pcall('hexists', KEYS[1], writer)
if type(w) == 'table' then
--#include type_error.lua
  return type_error(KEYS[1], 'hash')
end
if w == 1 then return take() end

--#include place.lua

local bad = prune_readers()
if bad then return bad end
if redis.call('exists', KEYS[1]) == 0 then
  -- No writer holds: the caller enters if no writer waits ahead of it.
  -- Readers at the head wait for nothing: a single server lets them in
  -- (the caller too, if it is one of them); a writer at the head of a lock
  -- nobody holds is handed it (the last reader left by a plain ZREM, whose
  -- rwwake.lua has not run yet, or a lease that ran out), and then the
  -- caller waits behind it.
  if handoff then
    grant_rw()
    if redis.call('zscore', R, owner) then return take() end
  elseif entry and leads(entry) then
    return take()
  end
  if redis.call('exists', KEYS[1]) == 0 then
    local head = redis.pcall('lindex', queue, 0)
    if type(head) == 'table' then
--#include type_error.lua
      return type_error(queue, 'list') or head
    end
    if not head or head == entry then return take() end
  end
end
local wait
wait, bad = rw_pttl()
if bad then return bad end
if not entry then return -4 * wait - 1 end
if not there then redis.call('rpush', queue, entry) end
redis.call('pexpire', queue, queue_keep)
return -4 * wait - 2
