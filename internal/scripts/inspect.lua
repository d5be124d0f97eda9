-- inspect: read every kind of lock under one name in one step, for
-- Client.Inspect and Client.ForceUnlock; writes nothing.
--
-- KEYS = the keys of each kind of lock in turn (see adminKinds in admin.go;
-- they all begin with P{N}, so they share one cluster slot). ARGV[1] says
-- what each key is, one letter a key:
--   h  holders in a hash (owner -> hold count): a DistMutex, the writer of a
--      DistRWMutex
--   r  read holders in a sorted set (owner -> deadline, server ms; 0 the
--      key's expiry)
--   p  a semaphore's holders in a hash (owner -> '<permits>:<deadline>',
--      the deadline in server ms; 0 the key's expiry: see sem.lua)
--   f  a fence counter
--   s  a semaphore's size (a string, kept without expiry)
--   q  a queue (a list of entries in arrival order: see queue.lua)
-- Returns one element a key: h {fields and counts (flat), PTTL}; r {live
-- holders and their remaining ms (flat)}; p {live holders, their permits
-- and remaining ms (flat; -1 ms: the key has no expiry)}; f the counter,
-- '' if none; s the size, '' if none; q the entries, in queue order (a
-- waiter whose process died is dropped only when its turn comes, see
-- queue.lua). For a key of another type, a fence counter or size that is
-- not an integer, or a semaphore's field that is no holding, the error
-- reply of acquire ('WRONGTYPE remutex <type> <key>', as sem.lua words it).
local roles = ARGV[1]
local want = {h = 'hash', r = 'zset', p = 'hash', f = 'string', s = 'string', q = 'list'}
for i = 1, #KEYS do
  local t = redis.call('type', KEYS[i])
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want[string.sub(roles, i, i)] then
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[i])
  end
end

local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- A fence counter's or (pattern '^%d+$') a size's value, '' if none.
local function fence(key, pattern)
  local f = redis.call('get', key) or ''
  if f ~= '' and not string.match(f, pattern or '^%-?%d+$') then
    return nil, redis.error_reply('WRONGTYPE remutex non-integer ' .. key)
  end
  return f
end

-- Holds whose deadline passed are no longer holds, pruned or not. A
-- deadline 0 is the key's expiry (a lone reader's, see rw.lua).
local function readers(key)
  local live = {}
  local z = redis.call('zrangebyscore', key, '0', '0')
  for i = 1, #z do
    live[#live + 1] = z[i]
    live[#live + 1] = math.max(redis.call('pttl', key), 0)
  end
  local r = redis.call('zrangebyscore', key, '(' .. string.format('%d', now), '+inf', 'withscores')
  for i = 1, #r, 2 do
    live[#live + 1] = r[i]
    live[#live + 1] = tonumber(r[i + 1]) - now
  end
  return live
end

-- A semaphore's holders whose deadline has not passed, pruned or not. A
-- deadline 0 is the key's expiry (a lone holder's, see sem.lua).
local function holdings(key)
  local live, all = {}, redis.call('hgetall', key)
  for i = 1, #all, 2 do
    local n, d = string.match(all[i + 1], '^(%d+):?(%d*),?%d*$')
    if not n then return nil, redis.error_reply('WRONGTYPE remutex foreign-field ' .. key) end
    d = tonumber(d) or 0
    local left
    if d == 0 then
      left = redis.call('pttl', key)
    elseif d > now then
      left = d - now
    end
    if left then
      live[#live + 1] = all[i]
      live[#live + 1] = tonumber(n)
      live[#live + 1] = left
    end
  end
  return live
end

local out = {}
for i = 1, #KEYS do
  local role, key = string.sub(roles, i, i), KEYS[i]
  if role == 'h' then
    out[i] = {redis.call('hgetall', key), redis.call('pttl', key)}
  elseif role == 'r' then
    out[i] = readers(key)
  elseif role == 'p' then
    local live, bad = holdings(key)
    if bad then return bad end
    out[i] = live
  elseif role == 'f' or role == 's' then
    local f, bad = fence(key, role == 's' and '^%d+$' or nil)
    if bad then return bad end
    out[i] = f
  elseif role == 'q' then
    out[i] = redis.call('lrange', key, '0', '-1')
  end
end
return out
