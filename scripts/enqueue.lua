-- The waiting side of the slow paths, included after queue.lua by the
-- scripts that acquire or queue (acquire, rlock, wlock): releases and leaves
-- never build these.

-- The fence counter must be missing or a string holding an integer.
local function counter_error()
  local v = redis.pcall('get', fence_key)
  if type(v) == 'table' then return type_error(fence_key, 'string') end
  if v and not string.match(v, '^%-?%d+$') then return type_error(fence_key, 'string', 'non-integer') end
  return nil
end

-- Entry: <claim ms>:<fencing>:<wait id>:<owner>; the owner begins with the
-- Client's id, which names the channel its Client listens on.
local function entry_of(claim, fencing, id, owner)
  return claim .. ':' .. fencing .. ':' .. id .. ':' .. owner
end

-- The caller's entry, from its wait id ARGV[6]: '' none (TryLock: never
-- queued); '<id>', or '+<id>' once known queued (then known is true); either
-- followed by ' <owner>' where the entry names an owner other than the
-- call's (a quorum, whose tries each have a token of their own, keeps one
-- entry per wait).
local function wait_entry(flag)
  local id, eo = ARGV[6], ARGV[1]
  if id == '' then return nil, false end
  local sp = string.find(id, ' ', 1, true)
  if sp then id, eo = string.sub(id, 1, sp - 1), string.sub(id, sp + 1) end
  local known = string.sub(id, 1, 1) == '+'
  if known then id = string.sub(id, 2) end
  return entry_of(claim, flag, id, eo), known
end

-- Adds entry at the tail (or keeps its place) and sets its liveness; the
-- queue keys live as long as their longest-lived entry. Returns an error
-- reply for a queue key of another type.
local function enqueue(entry, now, ttl)
  local ms = math.floor(now / 1000)
  local top, bad = zcall('zrange', alive, '-1', '-1', 'withscores')
  if bad then return bad end
  local _, qbad = zcall('zadd', KEYS[3], 'NX', digits(now), entry)
  if qbad then return qbad end
  redis.call('zadd', alive, digits(ms + ttl), entry)
  local keep = math.max(tonumber(top[2] or 0) - ms, ttl, 1)
  keep = digits(keep)
  redis.call('pexpire', KEYS[3], keep)
  redis.call('pexpire', alive, keep)
  return nil
end
