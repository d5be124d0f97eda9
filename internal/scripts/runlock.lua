-- runlock: lower a read hold's count (nested), or end the hold and pass the
-- lock on when it was the last (DistRWMutex.RUnlock).
--
-- KEYS = writer hash W, fence counter, queue, readers R (see rw.lua).
-- ARGV = owner, count wanted, lease ms ('0' keeps the deadline),
-- and the node's publish command (see queue.lua). Returns 0 not held, 1 done, 2
-- done and handed to the head of the queue. Like release.lua it leaves no
-- marker: a resent final release answers 0 (see doc.go).
local R, queue = KEYS[4], KEYS[3]
local owner, want = ARGV[1], ARGV[2]

if want ~= '0' then
  local d = redis.pcall('zscore', R, owner)
  if type(d) ~= 'string' then return 0 end
  local t = redis.call('time')
  local ms = t[1] * 1000 + math.floor(t[2] / 1000)
  if d ~= '0' and tonumber(d) <= ms then return 0 end -- (0: R's expiry, see rw.lua)
  if ARGV[3] ~= '0' then
    redis.call('zadd', R, string.format('%d', ms + ARGV[3]), owner)
    if redis.call('pttl', R) < tonumber(ARGV[3]) then redis.call('pexpire', R, ARGV[3]) end
  end
  return 1
end

if redis.pcall('zrem', R, owner) ~= 1 then return 0 end
-- Nobody queued: nothing to publish.
if redis.call('exists', queue) == 0 then return 1 end

--#include queue.lua
--#include rw.lua

if prune_readers() then return 1 end
return grant_rw()
