-- Shared by acquire, enqueue, release and leave. Every script of one lock gets
-- the same five keys, all beginning with P{N} so they share a cluster slot:
local hash     = KEYS[1] -- owner token -> hold count
local fencekey = KEYS[2] -- fencing counter (WithFencing only)
local queue    = KEYS[3] -- starvation queue: entry -> arrival (server µs)
local alive    = KEYS[4] -- starvation queue: entry -> liveness deadline (server ms)
local last     = KEYS[5] -- markers of the latest final releases (a list), for resent releases

-- Server time in milliseconds. Scripts run with effects replication, so TIME is
-- allowed and replicas receive the resulting writes, not the script.
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Server time in microseconds as a decimal string (no float formatting).
local function now_us_string()
  local t = redis.call('time')
  return t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

-- Next fencing token. A missing counter (first use, or a Redis restart without
-- persistence) is seeded from the server clock in µs so tokens keep rising.
local function next_fence()
  if redis.call('exists', fencekey) == 0 then
    redis.call('set', fencekey, now_us_string())
  end
  redis.call('incr', fencekey)
  return redis.call('get', fencekey)
end

local function pttl_of(key)
  local t = redis.call('pttl', key)
  if t < 0 then t = 0 end
  return t
end

local function wrongtype(key, t)
  return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. key)
end

-- Returns an error reply when key holds a type other than want (or none).
local function type_ok(key, want)
  local t = redis.call('type', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then return wrongtype(key, t) end
  return nil
end

-- Checked before the first write to the queue or fence keys, so a key of
-- another type under the lock's name is reported and left untouched.
local function queue_types_ok()
  return type_ok(queue, 'zset') or type_ok(alive, 'zset')
end

local function drop_entry(entry)
  redis.call('zrem', queue, entry)
  redis.call('zrem', alive, entry)
end

-- Removes queue entries whose waiter stopped refreshing them.
local function prune(now)
  local dead = redis.call('zrangebyscore', alive, '-inf', now)
  for i = 1, #dead do drop_entry(dead[i]) end
  if #dead > 0 then
    -- entries in queue without a deadline cannot be live either
    if redis.call('zcard', alive) == 0 then redis.call('del', queue) end
  end
end

-- Keeps the queue keys alive exactly as long as their longest-lived entry.
local function expire_queue(now)
  local top = redis.call('zrange', alive, -1, -1, 'withscores')
  if top[2] then
    local ttl = tonumber(top[2]) - now
    if ttl < 1 then ttl = 1 end
    redis.call('pexpire', queue, ttl)
    redis.call('pexpire', alive, ttl)
  end
end

-- Entry format: <claim ms>:<fencing 0|1>:<wait id>:<owner token>
-- Hands a free lock to the live head of the queue and publishes the grant,
-- which names the entry it answers. Returns true when a waiter was granted.
local function grant_head(now, pub, channel)
  while true do
    local head = redis.call('zrange', queue, 0, 0)[1]
    if not head then return false end
    local dl = redis.call('zscore', alive, head)
    drop_entry(head)
    if dl and tonumber(dl) > now then
      local claim, fencing, owner = string.match(head, '^(%d+):([01]):%d+:(.+)$')
      if claim then
        redis.call('hset', hash, owner, 1)
        redis.call('pexpire', hash, claim)
        local f = '0'
        if fencing == '1' then f = next_fence() end
        -- pcall: a caller without access to the channel (ACL) still hands
        -- the lock on; the grantee finds the grant on its next queue refresh.
        redis.pcall(pub, channel, 'g ' .. f .. ' ' .. head)
        -- Removing entries never needs a longer TTL on the queue keys.
        return true
      end
    end
  end
end

-- Announces that a lock became free: to the queue head if there is one,
-- otherwise to every subscriber. Returns 2 for a hand-off, 1 otherwise.
local function on_free(pub, channel)
  local n = redis.pcall('zcard', queue)
  if type(n) == 'number' and n > 0 and grant_head(now_ms(), pub, channel) then
    return 2
  end
  -- pcall: without access to the channel (ACL) waiters poll; the release
  -- itself stands and is reported as done.
  redis.pcall(pub, channel, 'r')
  return 1
end
