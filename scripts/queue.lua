-- Shared by the slow paths of acquire, release and leave; included after
-- their fast paths, so that an uncontended call never builds these. (What
-- only the waiting side needs, and the queue entry's format, is in
-- enqueue.lua.)
local fence_key, alive = KEYS[2], KEYS[4]
-- The last two arguments of every lock script: "<starvation threshold µs>
-- <publish command>" (the node's; a threshold of -1 never hands the lock
-- on: a quorum's servers only wake waiters) and "<entry ttl ms> <claim ms>
-- <channel prefix>" (the lock's).
local starve, pub = string.match(ARGV[#ARGV - 1], '^(%-?%d+) (%a+)$')
starve = tonumber(starve)
local ttl, claim, chan = string.match(ARGV[#ARGV], '^(%d+) (%d+) (.*)$')

-- Numbers reach Redis commands and messages as text. Handed over as Lua
-- numbers, each would be written with a floating-point format (Lua 5.1's
-- %.14g even loses digits of a µs timestamp; redis.call's %.17g is among
-- the costliest things a script here does): integers go as %d, which
-- writes every digit of a 64-bit integer. (No fence, 0, is the common
-- case: it needs no formatting.)
local function digits(x)
  if x == 0 then return '0' end
  return string.format('%d', x)
end

-- Server time in µs, exact as a Lua number (µs since 1970 stay below 2^53).
-- Scripts replicate their effects, so TIME is allowed.
local function now_us()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Next fencing token (see seed.lua for a missing counter).
local function next_fence()
  local f = redis.call('incr', fence_key)
--#include seed.lua
  return f
end

-- An error reply when key holds a type other than want (or none). t is the
-- type when the caller knows it.
local function type_error(key, want, t)
  t = t or redis.call('type', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. key)
  end
  return nil
end

-- Runs a read (or the script's first write) on a queue key: a key of
-- another type answers an error naming it, before anything was written. The
-- types are looked at only when the command failed.
local function zcall(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return nil, type_error(KEYS[3], 'zset') or type_error(alive, 'zset') or r
  end
  return r, nil
end

local function drop_entry(e)
  redis.call('zrem', KEYS[3], e)
  redis.call('zrem', alive, e)
end

-- Removes the entries whose waiters stopped refreshing them. Returns an
-- error reply for a queue key of another type (the queue itself is looked
-- at only with check: a release frees the lock whatever it holds).
local function prune(now, check)
  local dead, bad = zcall('zrangebyscore', alive, '-inf', digits(math.floor(now / 1000)))
  if bad then return bad end
  if check then
    local _, qbad = zcall('zcard', KEYS[3])
    if qbad then return qbad end
  end
  for i = 1, #dead do drop_entry(dead[i]) end
  if #dead > 0 and redis.call('zcard', alive) == 0 then redis.call('del', KEYS[3]) end
  return nil
end

-- The queue's first entry and its arrival time, or nil (call prune first).
local function queue_head()
  local h = redis.pcall('zrange', KEYS[3], '0', '0', 'withscores')
  if h.err then return nil end
  return h[1], tonumber(h[2])
end

local function starving(arrived, now)
  return arrived and starve >= 0 and now - arrived >= starve
end

-- The error reply for a lock hash with no expiry (PTTL -1): remutex never
-- leaves one, so something else wrote it, and it would not end by itself.
-- It names the key (with its length: both may hold spaces) and an owner.
local function no_expiry(key)
  local owner = redis.call('hkeys', key)[1] or ''
  return redis.error_reply('NOEXPIRY remutex ' .. #key .. ' ' .. key .. ' ' .. owner)
end

-- Passes a free lock on to the queue's live head, which has waited longest:
-- in starvation mode (the head has waited past the threshold, or force) the
-- lock is handed to it and its Client told 'g <fence> <entry>'; in normal
-- mode its Client is told 'w <entry>' and the lock stays free for whoever
-- takes it first. One message, to one Client. pcall: a caller without
-- rights on the channel still releases; the waiter's refresh finds out.
-- Returns 2 handed off, 1 otherwise.
local function grant_head(now, force)
  local head, arrived = queue_head()
  if not head then return 1 end
  local claim, fencing, owner = string.match(head, '^(%d+):(%d):%d+:(.+)$')
  if not claim then
    drop_entry(head)
    return 1
  end
  local channel = chan .. string.match(owner, '^[^:]+')
  if not force and not starving(arrived, now) then
    redis.pcall(pub, channel, 'w ' .. head)
    return 1
  end
  drop_entry(head)
  local f = 0
  if fencing ~= '0' then f = next_fence() end
  redis.call('hset', KEYS[1], owner, '1')
  redis.call('pexpire', KEYS[1], claim)
  redis.pcall(pub, channel, 'g ' .. digits(f) .. ' ' .. head)
  return 2
end
