-- once_release: the final release of a DistOnce's run, which records the
-- run's outcome in the same call, so that nobody sees the lock free without
-- the outcome (nor the outcome of a run whose hold had ended).
--
-- KEYS = hash, fence counter, queue (see acquire.lua), done record, error
-- record (see once.lua).
-- ARGV = owner, count wanted ('0': a once is never nested), outcome, and
-- the node's publish command (see queue.lua). The outcome is 'd<record>'
-- (done: kept without expiry, and the error record goes), 'e<ms>:<record>'
-- (failed: the error record, kept ms, for the run's waiters), or '0' (a
-- waiter that found the outcome and ran nothing).
-- Returns 0 not held (nothing recorded); 1 done; 2 done and handed to the
-- head of the queue.
local hash, queue = KEYS[1], KEYS[3]
local owner, want, out = ARGV[1], ARGV[2], ARGV[3]

--#include lower.lua
local kind = string.sub(out, 1, 1)
if kind == 'd' then
  redis.call('set', KEYS[4], string.sub(out, 2))
  redis.call('del', KEYS[5])
elseif kind == 'e' then
  local ms, rec = string.match(out, '^e(%d+):(.*)$')
  redis.call('set', KEYS[5], rec, 'px', ms)
end
if redis.call('exists', hash, queue) ~= 1 then return 1 end

--#include queue.lua

return grant_head()
