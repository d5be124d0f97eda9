-- Fragment, pasted where an entry script says --#include told.lua.
-- Reads: the includer's locals home, cid and msg; pub, handoff and sharded
--   (pub.lua).
-- Defines: told.
--
-- Tells the Client cid msg on <home>:released:<cid>; told is whether it
-- listens (not when its process is gone). pcall: a caller without rights on
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
local told = false
do
  local channel = home .. ':released:' .. cid
  local n
  if handoff then
    if sharded then
      n = redis.pcall('pubsub', 'shardnumsub', channel)
    elseif pub ~= 'pUBLISH' then
      n = redis.pcall('pubsub', 'numsub', channel)
    end
  end
  if type(n) ~= 'table' or n[2] ~= 0 then
    if sharded then
      n = redis.pcall('spublish', channel, msg)
    else
      n = redis.pcall('publish', channel, msg)
    end
    told = handoff or type(n) == 'number' and n > 0
  end
end
