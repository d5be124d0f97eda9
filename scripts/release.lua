-- release: ARGV = owner, wanted count, lease ms ('0' keeps the TTL), hold
-- sequence number (unique per owner), marker ttl ms, publish command, channel.
-- Returns 0 not held; 1 released or count lowered; 2 released and handed to
-- the head of the starvation queue.
local owner, wanted, lease = ARGV[1], ARGV[2], ARGV[3]
local relid = owner .. '#' .. ARGV[4]

local cur = redis.pcall('hget', hash, owner)
if type(cur) == 'table' then return 0 end -- the key holds another type: not ours
if not cur then
  -- A final release sent twice finds its own marker: report success again.
  if wanted == '0' and redis.pcall('get', last) == relid then return 1 end
  return 0
end

if wanted ~= '0' then
  redis.call('hset', hash, owner, wanted)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return 1
end

redis.call('hdel', hash, owner)
redis.call('set', last, relid, 'px', ARGV[5])
if redis.call('exists', hash) == 1 then return 1 end
return on_free(ARGV[6], ARGV[7])
