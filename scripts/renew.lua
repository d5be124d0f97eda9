-- renew: KEYS = lock hashes (one slot); ARGV = owner, lease ms pairs, one per
-- key. Extends a hash only where the owner's field exists. Returns one result
-- per key: 1 renewed, 0 not ours (the hold is lost).
local res = {}
for i = 1, #KEYS do
  if redis.pcall('hexists', KEYS[i], ARGV[2 * i - 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[2 * i])
    res[i] = 1
  else
    res[i] = 0
  end
end
return res
