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
-- head of the queue; 3 done, and the queue's waiters told the outcome.
local hash, queue = KEYS[1], KEYS[3]
local owner, want, out = ARGV[1], ARGV[2], ARGV[3]

--#include lower.lua
local kind = string.sub(out, 1, 1)
local told
if kind == 'd' then
  redis.call('set', KEYS[4], string.sub(out, 2))
  redis.call('del', KEYS[5])
  told = 'd'
elseif kind == 'e' then
  local ms, rec = string.match(out, '^e(%d+):(.*)$')
  redis.call('set', KEYS[5], rec, 'px', ms)
  told = 'e' .. rec
end
if told then
  -- Every queued waiter waited for this run: its outcome is theirs. They
  -- are told it, and leave the queue, all in this call: one message per
  -- waiting Client, 'o <outcome>\n<entry> <entry> ...' (the records are
  -- JSON: no newline), on which each returns without a call of its own,
  -- rather than be handed the lock one after the other to read the
  -- outcome. (A waiter that does not hear it finds its entry gone at its
  -- next call, and then the outcome.) A failed run's waiters return its
  -- error, and the next Do runs f, under the lock, one at a time.
  local entries = redis.pcall('lrange', queue, 0, -1)
  if type(entries) ~= 'table' or entries['err'] or #entries == 0 then return 1 end
  redis.call('del', queue)
  local by, cids = {}, {}
  for _, e in ipairs(entries) do
    local cid = string.match(e, '^%d+:.:[^:]*:([^:]+):')
    if cid then
      if not by[cid] then
        by[cid] = {}
        cids[#cids + 1] = cid
      end
      local of = by[cid]
      of[#of + 1] = e
    end
  end
  local sharded = ARGV[4] == 'spublish' or ARGV[4] == 'SPUBLISH' -- (commands named literally: see queue.lua)
  for _, cid in ipairs(cids) do
    local channel, msg = hash .. ':released:' .. cid, 'o ' .. told .. '\n' .. table.concat(by[cid], ' ')
    if sharded then
      redis.pcall('spublish', channel, msg)
    else
      redis.pcall('publish', channel, msg)
    end
  end
  return 3
end
if redis.call('exists', hash, queue) ~= 1 then return 1 end

--#include queue.lua

--#include pub.lua
local granted = 1
--#include grant.lua
return granted
