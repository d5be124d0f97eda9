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
-- Each command is named literally, as in the lock scripts (proxies that vet
-- scripts refuse a command name held in a variable); note records a refusal.
local function note(cmd, r)
  if type(r) == 'table' and r.err then
    refused[#refused + 1] = cmd .. ': ' .. r.err
  end
end
note('time', redis.pcall('time'))
note('exists', redis.pcall('exists', h, z, s, l))
note('hset', redis.pcall('hset', h, 'owner', '1'))
note('pexpire', redis.pcall('pexpire', h, '60000'))
note('hget', redis.pcall('hget', h, 'owner'))
note('hexists', redis.pcall('hexists', h, 'owner'))
note('hgetall', redis.pcall('hgetall', h))
note('hkeys', redis.pcall('hkeys', h))
note('pttl', redis.pcall('pttl', h))
note('type', redis.pcall('type', h))
note('hdel', redis.pcall('hdel', h, 'owner'))
note('zadd', redis.pcall('zadd', z, '1', 'entry'))
note('pexpire', redis.pcall('pexpire', z, '60000'))
note('zscore', redis.pcall('zscore', z, 'entry'))
note('zrangebyscore', redis.pcall('zrangebyscore', z, '-inf', '+inf'))
note('zcard', redis.pcall('zcard', z))
note('zremrangebyscore', redis.pcall('zremrangebyscore', z, '-inf', '0'))
note('zrem', redis.pcall('zrem', z, 'entry'))
note('rpush', redis.pcall('rpush', l, 'entry', 'other'))
note('pexpire', redis.pcall('pexpire', l, '60000'))
note('lpos', redis.pcall('lpos', l, 'entry'))
note('lindex', redis.pcall('lindex', l, 0))
note('lrange', redis.pcall('lrange', l, '0', '-1'))
note('lrem', redis.pcall('lrem', l, 1, 'other'))
note('lpop', redis.pcall('lpop', l))
note('set', redis.pcall('set', s, '1', 'px', '60000'))
note('get', redis.pcall('get', s))
note('incr', redis.pcall('incr', s))
note('del', redis.pcall('del', h, z, s, l))
local published
if ARGV[1] == 'spublish' then
  published = redis.pcall('spublish', ARGV[2], 'check')
else
  published = redis.pcall('publish', ARGV[2], 'check')
end
local pub_err = false
if type(published) == 'table' and published.err then
  pub_err = published.err
end
local count_err = false
if ARGV[3] ~= '' then
  local counted
  if ARGV[3] == 'shardnumsub' then
    counted = redis.pcall('pubsub', 'shardnumsub', ARGV[2])
  else
    counted = redis.pcall('pubsub', 'numsub', ARGV[2])
  end
  if type(counted) == 'table' and counted.err then
    count_err = counted.err
  end
end
return {refused, pub_err, count_err}
