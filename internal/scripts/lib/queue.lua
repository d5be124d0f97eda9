-- Fragment, pasted where an entry script says --#include queue.lua.
-- Reads: KEYS[1] (the home key), KEYS[2] (via fence.lua), KEYS[3] (the queue),
--   ARGV[#ARGV] (the node's publish command).
-- Defines: pub, handoff, sharded, next_fence() (fence.lua), digits(x),
--   tell(home, cid, msg), grant_head().
--
-- Passing a lock on to its queue: shared by the slow paths of the lock
-- scripts, included where they need it, so that a call that does not never
-- builds it. Lua builds each function below at every call that includes it
-- (about 1k instructions each): there are few of them.
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
-- The last argument of every lock script is the node's publish command:
-- 'publish', or 'spublish' on a Redis 7 cluster; in capitals ('PUBLISH',
-- 'SPUBLISH': Redis reads commands in any case) on a quorum's servers,
-- whose queues never hand the lock on, only wake waiters (one argument
-- fewer: each costs the server about as much as a command). 'pUBLISH' is
-- 'publish' on a cluster on classic pub/sub (Redis 6.2, or a cluster that
-- could not be asked for SPUBLISH): there every node relays the message,
-- and a Client may listen on any of them.
-- Every command is named literally (proxies that vet scripts refuse a
-- command name held in a variable): the argument only chooses between them.
local pub = ARGV[#ARGV]
local handoff = string.byte(pub) > 96 -- lower case
local sharded = pub == 'spublish' or pub == 'SPUBLISH'

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
-- listens (not when its process is gone); pcall: a caller without rights on
-- the channel still releases, and the waiter's refresh finds out.
--
-- A grant ('g') the script gives back when its Client does not listen, so
-- the message must not go out then: a message once published may reach the
-- Client whatever its count says (PUBLISH counts only this node's
-- listeners, and a replica, or on Redis 6.2 every node of a cluster,
-- delivers it too), and a grant taken from it after it was given back
-- would be a second holder. So the hand-off asks first whether the Client
-- listens here, and a grant it publishes stands. Where that cannot be told
-- (a cluster on classic pub/sub, or PUBSUB denied) every Client counts as
-- listening: a gone one blocks the lock for a claim lease. A quorum's
-- servers only wake waiters, and count the wake message's listeners.
local function tell(home, cid, msg)
  local channel = home .. ':released:' .. cid
  local n
  if handoff then
    if sharded then
      n = redis.pcall('pubsub', 'shardnumsub', channel)
    elseif pub ~= 'pUBLISH' then
      n = redis.pcall('pubsub', 'numsub', channel)
    end
    if type(n) == 'table' and n[2] == 0 then return false end
  end
  if sharded then
    n = redis.pcall('spublish', channel, msg)
  else
    n = redis.pcall('publish', channel, msg)
  end
  return handoff or type(n) == 'number' and n > 0
end

-- Passes a free lock held in KEYS[1] on to the queue's head, which has
-- waited longest: on a single server it is handed the lock and its Client
-- told 'g <fence> <entry>'; a quorum's server only tells it 'w <entry>' (it
-- may try now). One message, to one Client. A head whose Client does not
-- listen (its process is gone) is dropped, a grant to it given back, and the
-- next one served. Returns 2 handed off, 1 otherwise.
local function grant_head()
  for _ = 1, 8 do
    local head
    if handoff then
      head = redis.pcall('lpop', KEYS[3])
    else
      head = redis.pcall('lindex', KEYS[3], 0)
    end
    if type(head) ~= 'string' then return 1 end
    local claim, fencing, owner, cid = string.match(head, '^(%d+):(.):[^:]*:(([^:]+):.+)$')
    if not claim then
      if not handoff then redis.call('lrem', KEYS[3], 1, head) end
    elseif not handoff then
      if tell(KEYS[1], cid, 'w ' .. head) then return 1 end
      redis.call('lrem', KEYS[3], 1, head)
    else
      local f = '0'
      if fencing ~= '0' then f = digits(next_fence()) end
      redis.call('hset', KEYS[1], owner, '1')
      redis.call('pexpire', KEYS[1], claim)
      if tell(KEYS[1], cid, 'g ' .. f .. ' ' .. head) then return 2 end
      redis.call('hdel', KEYS[1], owner)
    end
  end
  return 1
end
