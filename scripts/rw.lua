-- Shared by the slow paths of the read/write lock's scripts (DistRWMutex),
-- included after queue.lua. KEYS = writer hash W (owner -> write count),
-- fence counter, queue, queue:alive, readers R (owner -> deadline, server
-- ms); all begin with P{N}:rw. Queue entries are
-- <claim ms>:<flag>:<wait id>:<owner>, flag 'w' a writer, 'r' a reader, in
-- capitals with fencing (a reader is told the latest write's token).
local W, R = KEYS[1], KEYS[5]
-- On a single server the queue hands the lock on at once (writers are
-- served in arrival order, readers behind a waiting writer wait); a
-- quorum's servers only wake the head.
local handoff = starve >= 0

local function parse_entry(e)
  return string.match(e, '^(%d+):(%a):%d+:(.+)$')
end

local function is_reader(flag)
  return flag == 'r' or flag == 'R'
end

-- The Client that waits on entry hears of it on <W or R>:released:<id>.
local function channel_of(flag, owner)
  local home = W
  if is_reader(flag) then home = R end
  return home .. ':released:' .. string.match(owner, '^[^:]+')
end

local function now_ms(now)
  return math.floor(now / 1000)
end

-- Drops the read holds whose deadline passed (their holder stopped
-- renewing). Returns an error reply for a readers key of another type.
local function prune_readers(ms)
  local _, bad = zcall('zremrangebyscore', R, '-inf', digits(ms))
  if bad then return type_error(R, 'zset') or bad end
  return nil
end

-- Adds or refreshes owner's read hold until ms + d; the key lives as long
-- as its latest deadline.
local function add_reader(owner, ms, d)
  d = tonumber(d)
  redis.call('zadd', R, digits(ms + d), owner)
  if redis.call('pttl', R) < d then redis.call('pexpire', R, digits(d)) end
end

-- The token of the latest write, for a reader that asks (flag 'R' or a
-- fencing argument other than '0').
local function latest_fence()
  return tonumber(redis.call('get', fence_key)) or 0
end

-- Tells entry's Client: 'g <fence> <entry>' if handed the lock, else
-- 'w <entry>' (it may try now).
local function tell(kind, f, entry, flag, owner)
  local msg = 'w ' .. entry
  if kind == 'g' then msg = 'g ' .. digits(f) .. ' ' .. entry end
  redis.pcall(pub, channel_of(flag, owner), msg)
end

-- Whether entry is among the readers at the head of the queue (looking at
-- the first 100 entries).
local function leads(entry)
  local batch = redis.call('zrange', KEYS[3], '0', '99')
  for i = 1, #batch do
    if batch[i] == entry then return true end
    local claim, flag = parse_entry(batch[i])
    if claim and not is_reader(flag) then return false end
  end
  return false
end

-- Lets in the readers at the head of the queue (up to the first writer).
local function grant_readers(now)
  local ms, n = now_ms(now), 0
  while true do
    local batch = redis.call('zrange', KEYS[3], '0', '99')
    for i = 1, #batch do
      local e = batch[i]
      local claim, flag, owner = parse_entry(e)
      if claim and not is_reader(flag) then return n end
      if not claim then
        drop_entry(e)
      elseif handoff then
        drop_entry(e)
        add_reader(owner, ms, claim)
        local f = 0
        if flag == 'R' then f = latest_fence() end
        tell('g', f, e, flag, owner)
        n = n + 1
      else
        tell('w', 0, e, flag, owner)
        n = n + 1
        if i == #batch then return n end
      end
    end
    if #batch < 100 or not handoff then return n end
  end
end

-- Passes the lock on to the head of the queue, when what it waits for is
-- over: a writer once nobody holds W or R, the readers at the head once
-- nobody holds W. Call prune and prune_readers first. Returns 2 handed off,
-- 1 otherwise.
local function grant_rw(now)
  local head = queue_head()
  if not head or redis.call('exists', W) == 1 then return 1 end
  local claim, flag, owner = parse_entry(head)
  if not claim then
    drop_entry(head)
    return 1
  end
  if is_reader(flag) then
    if grant_readers(now) > 0 and handoff then return 2 end
    return 1
  end
  if redis.call('zcard', R) > 0 then return 1 end
  if not handoff then
    tell('w', 0, head, flag, owner)
    return 1
  end
  drop_entry(head)
  local f = 0
  if flag == 'W' then f = next_fence() end
  redis.call('hset', W, owner, '1')
  redis.call('pexpire', W, claim)
  tell('g', f, head, flag, owner)
  return 2
end

-- How long until what the caller waits for may change by itself, for a
-- waiter's timer: the writer's remaining lease, else the latest reader's,
-- else (nobody holds; a quorum's waiter waits behind an entry whose waiter
-- may have gone) the head entry's liveness. A key with less than a
-- millisecond left (PTTL 0) is still there: the waiter looks again in 1ms,
-- not at the head's liveness. Returns nil and an error reply for a writer
-- hash without expiry.
local function rw_pttl(now)
  local t = redis.call('pttl', W)
  if t == -1 then return nil, no_expiry(W) end
  if t < 0 then t = redis.call('pttl', R) end
  if t >= 0 then return math.max(t, 1) end
  local head = queue_head()
  local d = head and tonumber(redis.call('zscore', alive, head))
  if d then return math.max(d - now_ms(now), 1) end
  return 0
end
