-- Fragment, pasted where an entry script says --#include place.lua.
-- Reads: KEYS[3] (the queue); entry, prev and known (enqueue.lua);
--   includes type_error.lua.
-- Defines: there (the entry's index in the queue, or false); returns -3 from
--   the including script for a known entry that is gone.
--
-- Where the caller stands in the queue, for the scripts that queue (after
-- enqueue.lua): there is its entry's index, or false; a previous entry
-- found is rewritten as this call's. A known entry that is gone (it was
-- handed the lock, which ended before the waiter took it, or its Client
-- was found gone) must queue again under a new wait id, not this one:
-- code 2.
local there = false
if entry then
  there = redis.pcall('lpos', KEYS[3], prev or entry)
  if type(there) == 'table' then
--#include type_error.lua
    return type_error(KEYS[3], 'list') or there
  end
  if prev then
    if there then
      redis.call('lset', KEYS[3], there, entry)
    else
      there = redis.call('lpos', KEYS[3], entry) -- (written by a call that got no answer)
    end
  end
  if known and not there then return -3 end
end
