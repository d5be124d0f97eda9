-- release: lower a hold's count, or end the hold and pass the lock on.
--
-- KEYS = hash, fence counter, queue (see acquire.lua).
-- ARGV = owner, count wanted, lease ms ('0' keeps the TTL; for a final
-- release, how long the key stays held by nobody, WithMinHold, '0' none),
-- and the node's publish command (see queue.lua).
-- Returns 0 not held; 1 done; 2 done and handed to the head of the queue.
--
-- A final release leaves no marker: a resent one finds nothing and answers 0,
-- and the caller, which sent it inside the hold's validity, knows that the
-- lock was still its own when the critical section ended (see doc.go).
local hash, queue = KEYS[1], KEYS[3]
local owner, want = ARGV[1], ARGV[2]

--#include lower.lua
-- WithMinHold: the key stays, held by nobody ('kept:' and the owner), for
-- the time left, and nobody is woken (the waiters look again when it ends).
if ARGV[3] ~= '0' then
  redis.call('hset', hash, 'kept:' .. owner, '0')
  redis.call('pexpire', hash, ARGV[3])
  return 1
end
-- Nobody queued: nothing to publish. Both keys there: a field left by
-- another owner keeps the lock held; its holder's release or lease ends it.
-- (One of them: the queue's head is looked up below, and there is none if
-- only the hash is left.)
if redis.call('exists', hash, queue) ~= 1 then return 1 end

--#include pub.lua
local granted = 1
--#include grant.lua
return granted
