-- raise: KEYS[1] = fence counter; ARGV[1] = token. Sets the counter to the
-- token unless it is already higher (quorum fencing: the token an acquisition
-- got from its majority is written back so any later majority exceeds it).
local cur = redis.call('get', KEYS[1])
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('set', KEYS[1], ARGV[1])
end
return 1
