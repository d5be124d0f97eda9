-- renew: KEYS = lock keys (one slot); ARGV = owner, lease pairs, one per
-- key. A lease in ms extends a lock hash where the owner's field exists; a
-- lease of 'r<ms>' moves a read hold's deadline in a read/write lock's
-- readers zset (see rw.lua) where the owner is a member whose deadline has
-- not passed (a lone reader's deadline 0, R's expiry, gets its value). Returns one result per key: 1 renewed, 0 not ours (the hold
-- is lost).
local res, ms = {}, nil
for i = 1, #KEYS do
  local owner, lease = ARGV[2 * i - 1], ARGV[2 * i]
  res[i] = 0
  if string.byte(lease) == 114 then
    if not ms then
      local t = redis.call('time')
      ms = t[1] * 1000 + math.floor(t[2] / 1000)
    end
    local d = redis.pcall('zscore', KEYS[i], owner)
    if type(d) == 'string' and (d == '0' or tonumber(d) > ms) then -- (0: R's expiry)
      local l = tonumber(string.sub(lease, 2))
      redis.call('zadd', KEYS[i], string.format('%d', ms + l), owner)
      if redis.call('pttl', KEYS[i]) < l then redis.call('pexpire', KEYS[i], string.sub(lease, 2)) end
      res[i] = 1
    end
  elseif redis.pcall('hexists', KEYS[i], owner) == 1 then
    redis.call('pexpire', KEYS[i], lease)
    res[i] = 1
  end
end
return res
