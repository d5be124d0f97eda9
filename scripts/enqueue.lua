-- enqueue: join the starvation queue, or refresh the entry's liveness, and
-- take the lock when it is free and this entry is the live head.
-- ARGV = owner, entry, entry ttl ms, lease ms, fencing '1'|'0', publish
-- command, channel.
-- Returns {1, fence} granted (full lease set); {2, pttl} still queued.
local owner, entry, ttl, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local fencing = ARGV[5] == '1'

local function types_bad()
  return type_ok(hash, 'hash') or queue_types_ok()
    or (fencing and type_ok(fencekey, 'string'))
end

local function granted_now()
  redis.call('pexpire', hash, lease)
  local f = 0
  if fencing then f = tonumber(redis.call('get', fencekey) or next_fence()) end
  return {1, f}
end

-- Reads that fail on a key of another type stand in for TYPE checks: the
-- types are looked at only then, and before any write.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dl = redis.pcall('zscore', alive, entry)
local mine = redis.pcall('hexists', hash, owner)
if type(dl) == 'table' then return types_bad() or dl end
if type(mine) == 'table' then return types_bad() or mine end
if fencing then
  local bad = type_ok(fencekey, 'string')
  if bad then return bad end
end
if not dl then
  if mine == 1 then
    -- Granted while we waited (the grant message may have been missed).
    return granted_now()
  end
  local added = redis.pcall('zadd', queue, t[1] .. string.rep('0', 6 - #t[2]) .. t[2], entry)
  if type(added) == 'table' then return types_bad() or added end
end
redis.call('zadd', alive, now + ttl, entry)
prune(now)
expire_queue(now)

if redis.call('exists', hash) == 0 then
  local head = redis.call('zrange', queue, 0, 0)[1]
  if head == entry then
    drop_entry(entry)
    redis.call('hset', hash, owner, 1)
    redis.call('pexpire', hash, lease)
    local f = 0
    if fencing then f = tonumber(next_fence()) end
    return {1, f}
  end
  grant_head(now, ARGV[6], ARGV[7])
  if redis.call('hexists', hash, owner) == 1 then return granted_now() end
end
return {2, pttl_of(hash)}
