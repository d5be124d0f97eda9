-- rlock: take a read/write lock for reading, confirm a read hold (nested),
-- or wait in the lock's queue (DistRWMutex.RLock).
--
-- KEYS = writer hash W, fence counter, queue, queue:alive, readers R (see
-- rw.lua). ARGV as acquire.lua's; the fence of a grant is the latest
-- write's token. Replies as acquire.lua's.
--
-- A read hold is a member of R whose score is its deadline on the server's
-- clock (now + lease, moved on by renewals), so that a reader that dies
-- stops blocking writers after its lease although others keep R alive.
local R, queue = KEYS[5], KEYS[3]
local owner, have, want, lease, fencing = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

-- The free path first: no writer, nobody queued (writer preference: a
-- reader that holds nothing waits behind any waiting writer).
if have == '0' and redis.call('exists', KEYS[1], queue, KEYS[4]) == 0 then
  local f = 0
  -- (No counter yet: no write so far, token 0. A key of another type: the
  -- slow path names it.)
  if fencing ~= '0' then f = tonumber(redis.pcall('get', KEYS[2]) or '0') end
  if f then
    local t = redis.call('time')
    local r = redis.pcall('zadd', R, string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + lease), owner)
    if type(r) == 'number' then
      if redis.call('pttl', R) < tonumber(lease) then redis.call('pexpire', R, lease) end
      return {1, f}
    end
  end
end

--#include queue.lua
--#include rw.lua
--#include enqueue.lua

local cur = redis.pcall('zscore', R, owner)
if type(cur) == 'table' then return type_error(R, 'zset') end
local now = now_us()
local ms = now_ms(now)
if cur and tonumber(cur) <= ms then
  -- Past its deadline: no longer a hold, whether or not pruned yet.
  redis.call('zrem', R, owner)
  cur = false
end

if have ~= '0' then
  if not cur then return {-1, 0} end
  if lease ~= '0' then add_reader(owner, ms, lease) end
  return {1, 0}
end

if fencing ~= '0' then
  local bad = counter_error()
  if bad then return bad end
end

local entry, known = wait_entry(fencing == '0' and 'r' or 'R')

local function take()
  add_reader(owner, ms, lease)
  if entry then drop_entry(entry) end
  local f = 0
  if fencing ~= '0' then f = latest_fence() end
  return {1, f}
end

-- Ours already (a resend, or a grant not heard of yet), or the writer
-- reading under its own write hold.
if cur then return take() end
local w = redis.pcall('hexists', KEYS[1], owner)
if type(w) == 'table' then return type_error(KEYS[1], 'hash') end
if w == 1 then return take() end

if known and not redis.pcall('zscore', alive, entry) then return {3, 0} end

local bad = prune(now, true) or prune_readers(ms)
if bad then return bad end
if redis.call('exists', KEYS[1]) == 0 then
  -- No writer holds: the caller enters if no writer waits ahead of it.
  -- Readers at the head wait for nothing: a single server lets them in
  -- (the caller too, if it is one of them).
  if handoff then
    grant_rw(now)
    if redis.call('zscore', R, owner) then return take() end
  elseif entry and leads(entry) then
    return take()
  end
  local head = queue_head()
  if not head or head == entry then return take() end
end
local wait
wait, bad = rw_pttl(now)
if bad then return bad end
if not entry then return {0, wait} end
bad = enqueue(entry, now, tonumber(ttl))
if bad then return bad end
return {2, wait}
