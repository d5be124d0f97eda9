-- leave: a queued waiter gives up. Removes its entry and, if the lock was
-- granted to it in the meantime, releases that grant so nobody waits for a
-- holder that does not know it holds.
-- ARGV = owner, entry, publish command, channel. Returns 1 if a grant was
-- released, else 0.
local owner, entry = ARGV[1], ARGV[2]
if type(redis.pcall('zrem', queue, entry)) == 'table' then return 0 end
redis.pcall('zrem', alive, entry)
if redis.pcall('hexists', hash, owner) ~= 1 then return 0 end
redis.call('hdel', hash, owner)
if redis.call('exists', hash) == 0 then on_free(ARGV[3], ARGV[4]) end
return 1
