-- raise: KEYS[1] = fence counter; ARGV[1] = token. Sets the counter to the
-- token unless it is already higher (quorum fencing: the token an acquisition
-- got from its majority is written back so any later majority exceeds it).
local cur = redis.pcall('get', KEYS[1])
if type(cur) == 'table' or (cur and not tonumber(cur)) then
  return redis.error_reply('WRONGTYPE remutex non-integer ' .. KEYS[1])
end
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1])
end
return 1
