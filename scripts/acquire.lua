-- acquire: ARGV = owner, expected count, wanted count, lease ms ('0' keeps
-- the TTL), fencing '0' off | '1' on | '2' on, always a new token (quorum),
-- publish command, channel.
-- Returns {1, fence} granted; {0, pttl} held by another; {2, pttl} waiters
-- are queued (starvation mode: no barging, the caller queues at once);
-- {-1, 0} a nested acquire found the hold gone.
local owner, expected, wanted, lease = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local fencing = ARGV[5] ~= '0'

local function grant()
  if fencing then
    local bad = type_ok(fencekey, 'string')
    if bad then return bad end
  end
  redis.call('hset', hash, owner, wanted)
  redis.call('pexpire', hash, lease)
  local f = 0
  if fencing then f = tonumber(next_fence()) end
  return {1, f}
end

local held = -2
if expected == '0' then held = redis.call('pttl', hash) end
if expected == '0' and held == -2 then
  -- Free. The common case, nobody queued, takes four commands.
  if redis.call('exists', queue, alive) == 0 then return grant() end
  local bad = queue_types_ok()
  if bad then return bad end
  local now = now_ms()
  prune(now)
  if redis.call('exists', queue) == 1 then
    -- Free, but waiters are queued and nobody handed it on (the last holder
    -- expired): hand it to the head now and make this caller queue.
    grant_head(now, ARGV[6], ARGV[7])
    return {2, pttl_of(hash)}
  end
  return grant()
end

local cur = redis.pcall('hget', hash, owner)
if type(cur) == 'table' then return type_ok(hash, 'hash') end

if expected ~= '0' then
  if not cur then return {-1, 0} end
  redis.call('hset', hash, owner, wanted)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return {1, 0}
end

if cur then
  -- Our field already exists: this call is a resend of one that was applied.
  -- Counts are absolute, so applying it again changes nothing. A quorum asks
  -- for a new token all the same: its field may be left from an attempt that
  -- did not win a majority.
  redis.call('hset', hash, owner, wanted)
  redis.call('pexpire', hash, lease)
  local f = 0
  if ARGV[5] == '2' then
    f = tonumber(next_fence())
  elseif fencing then
    f = tonumber(redis.call('get', fencekey) or next_fence())
  end
  return {1, f}
end

-- Held by another owner. While waiters are queued, say so: the caller then
-- queues at once instead of competing in normal mode first.
if held < 0 then held = 0 end
if redis.call('exists', queue) == 1 then return {2, held} end
return {0, held}
