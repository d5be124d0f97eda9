-- release: ARGV = owner, wanted count, lease ms ('0' keeps the TTL), hold
-- sequence number (unique per owner), marker ttl ms, publish command, channel.
-- Returns 0 not held; 1 released or count lowered; 2 released and handed to
-- the head of the starvation queue.
local owner, wanted, lease = ARGV[1], ARGV[2], ARGV[3]
local relid = owner .. '#' .. ARGV[4]

-- How many final releases keep their marker: enough that other holders'
-- releases between a release and its resend do not push it out.
local markers = 32

if wanted ~= '0' then
  -- a key of another type answers an error table: not ours
  if redis.pcall('hexists', hash, owner) ~= 1 then return 0 end
  redis.call('hset', hash, owner, wanted)
  if lease ~= '0' then redis.call('pexpire', hash, lease) end
  return 1
end

local n = redis.pcall('hdel', hash, owner)
if type(n) == 'table' then return 0 end -- the key holds another type: not ours
if n == 0 then
  -- A final release sent twice finds its own marker: report success again.
  local seen = redis.pcall('lrange', last, 0, markers - 1)
  if type(seen) == 'table' and not seen.err then
    for i = 1, #seen do
      if seen[i] == relid then return 1 end
    end
  end
  return 0
end

-- A rollback (sequence number '0' or '': an acquisition that failed, a
-- grant that came too late) has no caller that could resend it: no marker.
local rollback = ARGV[4] == '0' or ARGV[4] == ''
if not rollback and type(redis.pcall('lpush', last, relid)) == 'number' then
  redis.call('ltrim', last, 0, markers - 1)
  redis.call('pexpire', last, ARGV[5])
end
if redis.call('exists', hash) == 1 then return 1 end
return on_free(ARGV[6], ARGV[7])
