-- Fragment, pasted where an entry script says --#include grant.lua.
-- Reads: the includer's locals hash (KEYS[1]) and queue (KEYS[3]); KEYS[2]
--   (via fence.lua); pub, handoff and sharded (pub.lua).
-- Defines: nothing; sets the includer's local granted to 2 when it handed
--   the lock on (else leaves it).
--
-- Passes a free lock held in the hash on to the queue's head (see
-- queue.lua), which has waited longest: on a single server it is handed the
-- lock and its Client told 'g <fence> <entry>'; a quorum's server only tells
-- it 'w <entry>' (it may try now). One message, to one Client. A head whose
-- Client does not listen (its process is gone) is dropped, a grant to it
-- given back, and the next one served.
--
-- A block, not a function, as told.lua is: Lua builds a script's functions
-- at every call of it (about 1k instructions each, and more for Lua's
-- collector), and this is the hand-off's path.
for _ = 1, 8 do
  local head
  if handoff then
    head = redis.pcall('lpop', queue)
  else
    head = redis.pcall('lindex', queue, 0)
  end
  if type(head) ~= 'string' then break end
  local claim, flag, heir, cid = string.match(head, '^(%d+):(.):[^:]*:(([^:]+):.+)$')
  if not claim then
    if not handoff then redis.call('lrem', queue, 1, head) end
  else
    local home, msg = hash, nil
    if handoff then
      local f = '0'
      if flag ~= '0' then
--#include fence.lua
        f = string.format('%d', next_fence()) -- (%d: see digits in queue.lua)
      end
      redis.call('hset', home, heir, '1')
      redis.call('pexpire', home, claim)
      msg = 'g ' .. f .. ' ' .. head
    else
      msg = 'w ' .. head
    end
--#include told.lua
    if told then
      if handoff then granted = 2 end
      break
    end
    if handoff then
      redis.call('hdel', home, heir)
    else
      redis.call('lrem', queue, 1, head)
    end
  end
end
