-- Fragment, pasted where an entry script says --#include rw.lua.
-- Reads: KEYS[1] (writer hash), KEYS[3] (queue), KEYS[4] (readers); after
--   queue.lua (tell, digits, next_fence).
-- Defines: W, R, now, and the read/write helpers: parse_entry, is_reader,
--   prune_readers, anchor_readers, live, add_reader, latest_fence, leads,
--   grant_readers, grant_rw, rw_pttl.
--
-- Shared by the slow paths of the read/write lock's scripts (DistRWMutex),
-- included after queue.lua (and not grant.lua, a DistMutex's). KEYS =
-- writer hash W (owner -> write count), fence counter, queue (see
-- queue.lua: flag 'w' a writer, 'r' a reader, in capitals with fencing; a
-- reader is told the latest write's token), readers R (owner -> deadline,
-- server ms); all begin with P{N}:rw. A deadline of 0 is R's own expiry:
-- a lone reader's, written by quick_rlock.lua (or rlock.lua's free path)
-- without asking the clock; it is given its own deadline before any other
-- is written beside it, so that only R's only member has it.
local W, R = KEYS[1], KEYS[4]

-- The server's time in ms: the read holds' deadlines, which keep a reader
-- that died from blocking writers past its lease. (Scripts replicate their
-- effects, so TIME is allowed.)
local now
do
  local t = redis.call('time')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The parts of a queue entry: claim, flag, owner and Client id, or nil.
local function parse_entry(e)
  return string.match(e, '^(%d+):(.):[^:]*:(([^:]+):.+)$')
end

local function is_reader(flag)
  return flag == 'r' or flag == 'R'
end

-- Drops the read holds whose deadline passed (their holder stopped
-- renewing; a deadline 0 passes with R). Returns an error reply for a
-- readers key of another type.
local function prune_readers()
  local r = redis.pcall('zremrangebyscore', R, '(0', digits(now))
  if type(r) == 'table' then
    local t = redis.call('type', R)
    if type(t) == 'table' then t = t['ok'] end
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. R)
  end
  return nil
end

-- Gives a lone reader's deadline 0 (R's expiry) its value, before another
-- deadline is written beside it.
local anchored = false
local function anchor_readers()
  if anchored then return end
  anchored = true
  local z = redis.call('zrangebyscore', R, '0', '0')
  if z[1] then redis.call('zadd', R, digits(now + math.max(redis.call('pttl', R), 0)), z[1]) end
end

-- Whether a read hold with deadline d (a ZSCORE reply) holds now.
local function live(d)
  return d == '0' or tonumber(d) > now
end

-- Adds or refreshes owner's read hold until now + d ms; the key lives as
-- long as its latest deadline.
local function add_reader(owner, d)
  d = tonumber(d)
  anchor_readers()
  redis.call('zadd', R, digits(now + d), owner)
  if redis.call('pttl', R) < d then redis.call('pexpire', R, digits(d)) end
end

-- The token of the latest write, for a reader that asks (flag 'R' or a
-- fencing argument other than '0').
local function latest_fence()
  return tonumber(redis.call('get', KEYS[2])) or 0
end

-- Whether entry is among the readers at the head of the queue (looking at
-- the first 100 entries).
local function leads(entry)
  local batch = redis.call('lrange', KEYS[3], '0', '99')
  for i = 1, #batch do
    if batch[i] == entry then return true end
    local claim, flag = parse_entry(batch[i])
    if claim and not is_reader(flag) then return false end
  end
  return false
end

-- Lets in the readers at the head of the queue (up to the first writer): a
-- single server hands each the lock ('g <fence> <entry>' to its Client on
-- R:released:<client id>); a quorum's server only wakes them ('w <entry>').
-- A reader whose Client does not listen is dropped (and a read hold given
-- to it taken back). Returns how many were served.
local function grant_readers()
  local n = 0
  while true do
    local batch = redis.call('lrange', KEYS[3], '0', '99')
    for i = 1, #batch do
      local e = batch[i]
      local claim, flag, owner, cid = parse_entry(e)
      if claim and not is_reader(flag) then return n end
      if not handoff then
        if claim and tell(R, cid, 'w ' .. e) then
          n = n + 1
        else
          redis.call('lrem', KEYS[3], 1, e)
        end
      else
        redis.call('lpop', KEYS[3])
        -- (A second entry of a wait that holds already, a late copy of its
        -- first call's: it must not cut that hold back to a claim.)
        if claim and not redis.call('zscore', R, owner) then
          add_reader(owner, claim)
          local f = 0
          if flag == 'R' then f = latest_fence() end
          if tell(R, cid, 'g ' .. digits(f) .. ' ' .. e) then
            n = n + 1
          else
            redis.call('zrem', R, owner)
          end
        end
      end
    end
    if #batch < 100 or not handoff then return n end
  end
end

-- Passes the lock on to the head of the queue, when what it waits for is
-- over: a writer once nobody holds W or R, the readers at the head once
-- nobody holds W (on a quorum's servers: only wakes them). A writer whose
-- Client does not listen is dropped, and the next one served. Call
-- prune_readers first. Returns 2 handed off, 1 otherwise.
local function grant_rw()
  for _ = 1, 8 do
    local head = redis.pcall('lindex', KEYS[3], 0)
    if type(head) ~= 'string' or redis.call('exists', W) == 1 then return 1 end
    local claim, flag, owner, cid = parse_entry(head)
    if not claim then
      redis.call('lpop', KEYS[3])
    elseif is_reader(flag) then
      if grant_readers() > 0 and handoff then return 2 end
      return 1
    elseif redis.call('zcard', R) > 0 then
      return 1
    elseif not handoff then
      if tell(W, cid, 'w ' .. head) then return 1 end
      redis.call('lpop', KEYS[3])
    else
      redis.call('lpop', KEYS[3])
      local f = 0
      if flag == 'W' then f = next_fence() end
      redis.call('hset', W, owner, '1')
      redis.call('pexpire', W, claim)
      if tell(W, cid, 'g ' .. digits(f) .. ' ' .. head) then return 2 end
      redis.call('hdel', W, owner)
    end
  end
  return 1
end

-- How long until what the caller waits for may change by itself, for a
-- waiter's timer: the writer's remaining lease, else the latest reader's,
-- else (nobody holds; a quorum's waiter waits behind a head that may be
-- gone) the queue's own. A key with less than a millisecond left (PTTL 0)
-- is still there: the waiter looks again in 1ms. Returns nil and an error
-- reply for a writer hash without expiry.
local function rw_pttl()
  local t = redis.call('pttl', W)
  if t == -1 then
    local o = redis.call('hkeys', W)[1] or ''
    return nil, redis.error_reply('NOEXPIRY remutex ' .. #W .. ' ' .. W .. ' ' .. o)
  end
  if t < 0 then t = redis.call('pttl', R) end
  if t < 0 then t = redis.call('pttl', KEYS[3]) end
  if t >= 0 then return math.max(t, 1) end
  return 0
end
