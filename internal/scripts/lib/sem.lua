-- Fragment, pasted where an entry script says --#include sem.lua.
-- Reads: KEYS[1] (holders), KEYS[3] (queue), KEYS[4] (size); after queue.lua
--   (digits, tell, next_fence).
-- Defines: H, now, and the semaphore helpers: stored_size, holding, token_of,
--   held, add_holder, grant_sem.
--
-- Shared by the slow paths of a semaphore's scripts (DistSemaphore),
-- included after queue.lua (for digits, tell and next_fence). KEYS =
-- holders H, fence counter, queue, size S; all begin with P{N}:sem.
--
-- H maps each acquisition's owner token to '<permits>:<deadline>', the
-- deadline in server ms, past which a holder that stopped renewing holds
-- nothing. '<permits>' alone (deadline 0) is H's own expiry: a lone
-- holder's, written by quick_sem.lua (or quick_lock.lua, for one permit)
-- or sem_acquire.lua's free path without asking the clock; it is given its
-- deadline before another holder is written beside it, so that only H's
-- only field has none. With fencing the acquisition's token follows:
-- '<permits>[:<deadline>],<fence>' (renew.lua and sem_release.lua keep it),
-- so that a call that finds its holding already there answers its own. S is the size, kept without expiry (like the
-- fence counter). Queue entries (see queue.lua) carry the permits asked
-- for after the arrival: <claim>:<flag>:<wait id>.<arrival>.<permits>:<owner>,
-- the flag 's', or 'S' with fencing.
local H = KEYS[1]

local now
do
  local t = redis.call('time')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The size in S (nil if none), or false and an error reply for a key of
-- another type or a value that is no size.
local function stored_size()
  local v = redis.pcall('get', KEYS[4])
  if type(v) == 'table' then
    local t = redis.call('type', KEYS[4])
    if type(t) == 'table' then t = t['ok'] end
    return false, redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[4])
  end
  if not v then return nil end
  if not string.match(v, '^%d+$') then
    return false, redis.error_reply('WRONGTYPE remutex non-integer ' .. KEYS[4])
  end
  return tonumber(v)
end

-- The permits, deadline (0: none, H's expiry) and fence suffix ('' or
-- ',<fence>') of a holder's value; nil if it is no holding.
local function holding(v)
  local n, d, f = string.match(v, '^(%d+):?(%d*)(,?%d*)$')
  return tonumber(n), tonumber(d) or 0, f
end

-- The fencing token of owner's holding (0 without fencing or holding).
local function token_of(owner)
  local v = redis.call('hget', H, owner)
  local f = v and string.match(v, ',(%d+)$')
  return tonumber(f) or 0
end

-- Drops the holders whose deadline passed, and gives a lone holder's
-- deadline 0 a value when others are (or are to be) beside it. Returns
-- the permits held, and how long until a holder's deadline (H's TTL for a
-- deadline 0), or nil and an error reply for a field that is no holding.
local function held(anchor)
  local all = redis.call('hgetall', H)
  local total, soonest, lone, suffix = 0, nil, nil, nil
  for i = 1, #all, 2 do
    local n, d, f = holding(all[i + 1])
    if not n then return nil, nil, redis.error_reply('WRONGTYPE remutex foreign-field ' .. H) end
    if d == 0 then
      lone, suffix = i, f
      total = total + n
    elseif d <= now then
      redis.call('hdel', H, all[i])
    else
      total = total + n
      soonest = math.min(soonest or d - now, d - now)
    end
  end
  if lone then
    local left = math.max(redis.call('pttl', H), 0)
    soonest = math.min(soonest or left, left)
    if anchor then redis.call('hset', H, all[lone], all[lone + 1]:match('^%d+') .. ':' .. digits(now + left) .. suffix) end
  end
  return total, soonest
end

-- Adds owner's holding of n permits until now + d ms, with fencing token
-- f (0: none); H lives as long as its latest deadline. Call held(true)
-- first when H may have holders.
local function add_holder(owner, n, d, f)
  d = tonumber(d)
  local v = n .. ':' .. digits(now + d)
  if f ~= 0 then v = v .. ',' .. digits(f) end
  redis.call('hset', H, owner, v)
  if redis.call('pttl', H) < d then redis.call('pexpire', H, digits(d)) end
end

-- Hands permits to the heads of the queue, first in, first out: each head
-- whose request fits in what is free gets it, with 'g <fence> <entry>' to
-- its Client; the first that does not fit stops the others behind it. A head
-- whose Client does not listen is dropped (its grant taken back). total is
-- the permits held now. Returns how many heads were served.
local function grant_sem(total, size)
  local served = 0
  for _ = 1, 100 do
    local head = redis.pcall('lindex', KEYS[3], 0)
    if type(head) ~= 'string' then return served end
    local claim, flag, n, owner, cid = string.match(head, '^(%d+):(.):[^:]*%.(%d+):(([^:]+):.+)$')
    n = tonumber(n)
    if claim and total + n > size then return served end
    redis.call('lpop', KEYS[3])
    -- (A second entry of a wait that holds already, a late copy of its
    -- first call's: it must not cut that holding back to a claim.)
    if claim and redis.call('hexists', H, owner) == 0 then
      local f = 0
      if flag == 'S' then f = next_fence() end
      add_holder(owner, n, claim, f)
      if tell(H, cid, 'g ' .. digits(f) .. ' ' .. head) then
        total, served = total + n, served + 1
      else
        redis.call('hdel', H, owner)
      end
    end
  end
  return served
end
