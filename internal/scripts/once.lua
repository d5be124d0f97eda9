-- once: read ('get') or delete ('del', an operator's reset) the records of
-- a DistOnce. (A Do reads them with two GETs: 'get' only when one of those
-- failed, for an error that names a record key of another type.)
--
-- KEYS = hash, fence counter, queue (its lock's: see acquire.lua), done
-- record (a string, kept without expiry), error record (a string, kept
-- briefly): the records are written by once_release.lua alone.
-- ARGV = 'get' or 'del'.
-- Returns for 'get' {done record or false, error record or false}; for
-- 'del' the number of records deleted. A record key of another type is an
-- error that names it, and nothing is written.
local rec = {false, false}
for i = 1, 2 do
  local v = redis.pcall('get', KEYS[3 + i])
  if type(v) == 'table' then
    local t = redis.call('type', KEYS[3 + i])
    if type(t) == 'table' then t = t['ok'] end
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[3 + i])
  end
  rec[i] = v
end
if ARGV[1] == 'del' then return redis.call('del', KEYS[4], KEYS[5]) end
return rec
