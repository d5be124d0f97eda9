-- inspect: read a lock's state in one step for Client.Inspect; writes nothing.
--
-- KEYS = hash, fence counter, queue, queue:alive (see acquire.lua).
-- Returns {hash fields and hold counts (flat), PTTL of the hash, fence
-- counter ('' if none), live queue entries and their arrival in server µs
-- (flat, in arrival order)}; for a key of another type, or a fence counter
-- that is not an integer, the error reply of acquire ('WRONGTYPE remutex
-- <type> <key>').
local want = {'hash', 'string', 'zset', 'zset'}
for i = 1, 4 do
  local t = redis.call('type', KEYS[i])
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want[i] then
    return redis.error_reply('WRONGTYPE remutex ' .. t .. ' ' .. KEYS[i])
  end
end

local fence = redis.call('get', KEYS[2]) or ''
if fence ~= '' and not string.match(fence, '^%-?%d+$') then
  return redis.error_reply('WRONGTYPE remutex non-integer ' .. KEYS[2])
end

-- Live entries: those whose liveness deadline (server ms) has not passed;
-- the others are pruned by the next script that looks at the queue.
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waiters = {}
local queue = redis.call('zrange', KEYS[3], '0', '-1', 'withscores')
for i = 1, #queue, 2 do
  local deadline = redis.call('zscore', KEYS[4], queue[i])
  if deadline and tonumber(deadline) > now then
    waiters[#waiters + 1] = queue[i]
    waiters[#waiters + 1] = queue[i + 1]
  end
end

return {redis.call('hgetall', KEYS[1]), redis.call('pttl', KEYS[1]), fence, waiters}
