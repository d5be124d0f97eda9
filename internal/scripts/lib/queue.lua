-- Fragment, pasted where an entry script says --#include queue.lua.
-- Reads: KEYS[2] (via fence.lua), ARGV[#ARGV] (via pub.lua).
-- Defines: pub, handoff, sharded (pub.lua), next_fence() (fence.lua),
--   digits(x), tell(home, cid, msg).
--
-- The queue (KEYS[3]) is a list of entries in arrival order:
-- <claim ms>:<flag>:<wait id>.<arrival ms>:<owner>. The claim is the lease
-- of a grant until the waiter's watchdog extends it; the flag is '0' or '1'
-- (a DistMutex waiter without or with fencing), 'w' or 'W' a writer, 'r' or
-- 'R' a reader (a DistRWMutex); the wait id tells a waiter's waits apart
-- (the arrival, on the waiter's clock, is for Client.Inspect); the owner
-- begins with the Client's id, which names the channel its Client listens
-- on. A waiter whose Client no longer listens (its process died: nobody
-- subscribes to its channel) is dropped when its turn comes.
--
-- What the queues of a DistRWMutex and a DistSemaphore share (rw.lua,
-- sem.lua), as functions: Lua builds each at every call that includes this
-- (about 1k instructions each). A DistMutex's scripts pass the lock on with
-- grant.lua, which builds none.
--#include pub.lua
--#include fence.lua

-- Numbers reach Redis commands and messages as text. Handed over as Lua
-- numbers, each would be written with a floating-point format (redis.call's
-- %.17g is among the costliest things a script here does): integers go as
-- %d, which writes every digit of a 64-bit integer. (No fence, 0, is the
-- common case: it needs no formatting.)
local function digits(x)
  if x == 0 then return '0' end
  return string.format('%d', x)
end

-- Tells the Client cid msg on <home>:released:<cid>, and whether it
-- listens: see told.lua.
local function tell(home, cid, msg)
--#include told.lua
  return told
end
