-- quick_rlock: the free path of rlock.lua alone, for a read/write lock its
-- Client has not seen contended lately (see quick_lock.lua).
--
-- KEYS = writer hash W, queue, readers R (see rw.lua), and the fence counter
-- WithFencing. ARGV = owner, lease ms.
-- Returns the latest write's fence token (0 without fencing, or before any
-- write) when no writer held it and nobody queued, and the read hold is now
-- in R; -1 otherwise, having written nothing.
--
-- A lone reader, the common case, needs neither the server's clock nor a
-- second EXISTS: it is R's only member, with the deadline 0, which says
-- that its deadline is R's expiry (see rw.lua). Joining other readers, it
-- gives such a member its deadline first.
local alone = redis.call('exists', KEYS[1], KEYS[2], KEYS[3]) == 0
if not alone and redis.call('exists', KEYS[1], KEYS[2]) ~= 0 then return -1 end
local f = 0
if KEYS[4] then
  f = tonumber(redis.pcall('get', KEYS[4]) or '0')
  if not f then return -1 end -- rlock.lua names the error
end
if alone then
  redis.call('zadd', KEYS[3], '0', ARGV[1])
  redis.call('pexpire', KEYS[3], ARGV[2])
  return f
end
local z = redis.pcall('zrangebyscore', KEYS[3], '0', '0')
if type(z) ~= 'table' or z['err'] then return -1 end
local t = redis.call('time')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local left = redis.call('pttl', KEYS[3])
if z[1] then redis.call('zadd', KEYS[3], string.format('%d', now + math.max(left, 0)), z[1]) end
redis.call('zadd', KEYS[3], string.format('%d', now + ARGV[2]), ARGV[1])
if left < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[3], ARGV[2]) end
return f
