-- check: runs each command the lock scripts run, once, on keys of the
-- Client's prefix that no lock uses, and removes them again (they expire
-- within a minute should DEL be refused). Client.Check calls it to name the
-- commands, keys or channels an ACL user may not use.
--
-- KEYS = a hash, a sorted set, a string and a list under the prefix, one
-- slot.
-- ARGV = the publish command ('publish' or 'spublish'), a channel under
-- the prefix, and the PUBSUB subcommand that counts its listeners before a
-- hand-off ('numsub', 'shardnumsub'; '' where none is asked: see queue.lua).
-- Returns the refused commands, each as "<command>: <error>", and the
-- publish command's and the PUBSUB count's errors (false if not refused),
-- apart: the lock scripts publish and count with pcall, waiters that hear
-- nothing poll, and a count refused hands the lock to gone waiters too
-- (each blocks it for a claim lease), so either degrades the locks where a
-- refused command breaks them.
local h, z, s, l = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local refused = {}
local function try(cmd, ...)
  local r = redis.pcall(cmd, ...)
  if type(r) == 'table' and r.err then
    refused[#refused + 1] = cmd .. ': ' .. r.err
  end
  return r
end
try('time')
try('exists', h, z, s, l)
try('hset', h, 'owner', '1')
try('pexpire', h, '60000')
try('hget', h, 'owner')
try('hexists', h, 'owner')
try('hgetall', h)
try('hkeys', h)
try('pttl', h)
try('type', h)
try('hdel', h, 'owner')
try('zadd', z, '1', 'entry')
try('pexpire', z, '60000')
try('zscore', z, 'entry')
try('zrangebyscore', z, '-inf', '+inf')
try('zcard', z)
try('zremrangebyscore', z, '-inf', '0')
try('zrem', z, 'entry')
try('rpush', l, 'entry', 'other')
try('pexpire', l, '60000')
try('lpos', l, 'entry')
try('lindex', l, 0)
try('lrange', l, '0', '-1')
try('lrem', l, 1, 'other')
try('lpop', l)
try('set', s, '1', 'px', '60000')
try('get', s)
try('incr', s)
try('del', h, z, s, l)
local published = redis.pcall(ARGV[1], ARGV[2], 'check')
local pub_err = false
if type(published) == 'table' and published.err then
  pub_err = published.err
end
local count_err = false
if ARGV[3] ~= '' then
  local counted = redis.pcall('pubsub', ARGV[3], ARGV[2])
  if type(counted) == 'table' and counted.err then
    count_err = counted.err
  end
end
return {refused, pub_err, count_err}
