-- renew: KEYS = lock keys (one slot); ARGV = owner, lease pairs, one per
-- key. A lease in ms extends a lock hash where the owner's field exists; a
-- lease of 'r<ms>' moves a read hold's deadline in a read/write lock's
-- readers zset (see rw.lua) where the owner is a member whose deadline has
-- not passed (a lone reader's deadline 0, R's expiry, gets its value); a
-- lease of 'p<ms>' does the same for a semaphore's holder (see sem.lua),
-- whose deadline is in its field's value (after its permits, before its
-- fencing token). Returns one result per key: 1
-- renewed, 0 not ours (the hold is lost).
local res, ms = {}, nil
local function now()
  if not ms then
    local t = redis.call('time')
    ms = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return ms
end
-- Extends key's expiry to at least l ms (written as lease without its
-- first letter): it lives as long as its latest holder.
local function keep(key, l, lease)
  if redis.call('pttl', key) < l then redis.call('pexpire', key, string.sub(lease, 2)) end
end
for i = 1, #KEYS do
  local owner, lease = ARGV[2 * i - 1], ARGV[2 * i]
  local kind = string.byte(lease)
  res[i] = 0
  if kind == 114 then -- 'r'
    local d = redis.pcall('zscore', KEYS[i], owner)
    if type(d) == 'string' and (d == '0' or tonumber(d) > now()) then -- (0: R's expiry)
      local l = tonumber(string.sub(lease, 2))
      redis.call('zadd', KEYS[i], string.format('%d', now() + l), owner)
      keep(KEYS[i], l, lease)
      res[i] = 1
    end
  elseif kind == 112 then -- 'p'
    local v = redis.pcall('hget', KEYS[i], owner)
    local n, d, f
    if type(v) == 'string' then n, d, f = string.match(v, '^(%d+):?(%d*)(,?%d*)$') end
    local l = tonumber(string.sub(lease, 2))
    if d == '' or d == '0' then -- a lone holder: its deadline is the key's expiry
      keep(KEYS[i], l, lease)
      res[i] = 1
    elseif d and tonumber(d) > now() then
      redis.call('hset', KEYS[i], owner, n .. ':' .. string.format('%d', now() + l) .. f)
      keep(KEYS[i], l, lease)
      res[i] = 1
    end
  elseif redis.pcall('hexists', KEYS[i], owner) == 1 then
    redis.call('pexpire', KEYS[i], lease)
    res[i] = 1
  end
end
return res
