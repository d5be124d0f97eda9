-- quick_rlock: the free path of rlock.lua alone, for a read/write lock its
-- Client has not seen contended lately (see quick_lock.lua).
--
-- KEYS = writer hash W, queue, readers R (see rw.lua), and the fence counter
-- WithFencing. ARGV = owner, lease ms.
-- Returns the latest write's fence token (0 without fencing, or before any
-- write) when no writer held it and nobody queued, and the read hold is now
-- in R; -1 otherwise, having written nothing.
-- One EXISTS tells a lone reader, the common case, that R is new and needs
-- its TTL set; a second one is needed when other readers hold it.
local alone = redis.call('exists', KEYS[1], KEYS[2], KEYS[3]) == 0
if not alone and redis.call('exists', KEYS[1], KEYS[2]) ~= 0 then return -1 end
local f = 0
if KEYS[4] then
  f = tonumber(redis.pcall('get', KEYS[4]) or '0')
  if not f then return -1 end -- rlock.lua names the error
end
local t = redis.call('time')
local r = redis.pcall('zadd', KEYS[3], string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + ARGV[2]), ARGV[1])
if type(r) ~= 'number' then return -1 end
if alone or redis.call('pttl', KEYS[3]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[3], ARGV[2]) end
return f
