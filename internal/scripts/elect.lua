-- elect: a DistElection's published leader. The leader's hold is a mutex's
-- (acquire.lua, release.lua, leave.lua on the election's own keys); this
-- script writes and reads what it publishes: the record and the log.
--
-- KEYS = hash (the leader's hold), fence counter (its tokens are the
-- terms), queue (see acquire.lua), record (a string, kept without expiry),
-- log (a stream of records, one per term, of at least the latest 1000
-- terms; kept without expiry).
-- ARGV[1] is the operation:
--   'p', owner, term, value, channel, publish command: publish value as the
--     leader's. Only the holder publishes: a missing owner field answers 0
--     (not the leader, or the term ended). Else the record
--     '<term>-<n> <since ms> <owner> <value>' (n the term's n'th
--     publication, since the server's clock at its first) is stored and
--     published as '<previous ID> <record>' on the channel; answers its ID.
--     A term's first record is also logged, under its ID <term>-<n>,
--     after the previous term's entry (that term's first record) was
--     replaced by that term's last. The same owner and value again (a
--     resend) answer the record's ID and write nothing. A later term in the
--     record or the log answers 0: this one is over.
--   'l': {1 if the record's owner holds the hash else 0, record or false}.
--   'r', ID: {the log's oldest ID or '', then the records after ID, oldest
--     first: the log's (at most 256), and the record if it is later}. An
--     oldest ID of a term above ID's says that terms after ID's may be gone
--     (trimmed, or the log lost).
-- A key of another type is an error reply naming it; nothing is written.
-- Invariant: the log holds one entry per term, for at least the latest
-- 1000 terms (the cap counts terms, not publications; MAXLEN ~ trims whole
-- nodes of at most 100 entries, so it keeps fewer than 1100): each earlier
-- term's last record, and the record's term's first; the record is the
-- latest. IDs only rise, so no reader of the log goes back a term. (A
-- term's values after its first are not logged while it lasts: so a
-- Proclaim writes no stream entry, and the log keeps no deleted entry for
-- each of them, for a stream frees an entry's space only with its node.)
local hash, rec_key, log = KEYS[1], KEYS[4], KEYS[5]
local op = ARGV[1]
local bad -- a key of another type (see key_error.lua)

local rec = redis.pcall('get', rec_key)
if type(rec) == 'table' then
  bad = rec_key
--#include key_error.lua
end

if op == 'r' then
  local t, n = string.match(ARGV[2], '^(%d+)%-(%d+)$')
  local from = t .. '-' .. string.format('%d', tonumber(n) + 1)
  local entries = redis.pcall('xrange', log, from, '+', 'COUNT', 256)
  if entries['err'] then
    bad = log
--#include key_error.lua
  end
  local first = redis.call('xrange', log, '-', '+', 'COUNT', 1)[1]
  local out = {first and first[1] or ''}
  for i, e in ipairs(entries) do out[i + 1] = e[2][2] end
  if rec and #entries < 256 then
    -- The record, if later than the last ID answered (or asked about).
    local lt, ln = t, n
    if #entries > 0 then
      lt, ln = string.match(entries[#entries][1], '^(%d+)%-(%d+)$')
    end
    local rt, rn = string.match(rec, '^(%d+)%-(%d+) ')
    if rt then
      lt, ln, rt, rn = tonumber(lt), tonumber(ln), tonumber(rt), tonumber(rn)
      if rt > lt or rt == lt and rn > ln then out[#out + 1] = rec end
    end
  end
  return out
end

-- The owner whose hold is asked about: the record's ('l'), the caller's ('p').
local owner
if op == 'l' then
  if not rec then return {0, false} end
  owner = string.match(rec, '^%d+%-%d+ %d+ (%S+) ')
  if not owner then return {0, rec} end
else
  owner = ARGV[2]
end
local held = redis.pcall('hexists', hash, owner)
if type(held) == 'table' then
  bad = hash
--#include key_error.lua
end
if op == 'l' then return {held, rec} end

-- 'p'
if held == 0 then return 0 end
local term, value, channel = ARGV[3], ARGV[4], ARGV[5]
local n, since, prev = 1, nil, '0-0'
local prev_term, prev_n = nil, 0 -- the record's
if rec then
  local pt, pn, ps, po, pv = string.match(rec, '^(%d+)%-(%d+) (%d+) (%S+) (.*)$')
  if not pt then
    -- A string this script did not write: name it, keep it.
    return redis.error_reply('WRONGTYPE remutex foreign-record ' .. rec_key)
  end
  prev, prev_term, prev_n = pt .. '-' .. pn, pt, tonumber(pn)
  local a, b = tonumber(pt), tonumber(term)
  if a > b then return 0 end
  if a == b then
    if po == owner and pv == value then return prev end
    n, since = tonumber(pn) + 1, ps
  end
end
if not since then
  local t = redis.call('time')
  since = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
end
local id = term .. '-' .. string.format('%d', n)
local record = id .. ' ' .. since .. ' ' .. owner .. ' ' .. value
if n == 1 then
  if prev_n > 1 then
    -- The previous term's entry, its first record, gives way to its last.
    local kept = redis.pcall('xadd', log, prev, 'r', rec)
    if type(kept) ~= 'table' then redis.call('xdel', log, prev_term .. '-1') end
  end
  local added = redis.pcall('xadd', log, 'MAXLEN', '~', '1000', id, 'r', record)
  if type(added) == 'table' and added['err'] then
    local t = redis.call('type', log)
    if type(t) == 'table' then t = t['ok'] end
    if t ~= 'stream' then
      if t == 'none' then return added end
      bad = log
--#include key_error.lua
    end
    -- The log went past the record (the record was deleted): go on from
    -- the log's last entry.
    local top = redis.call('xrevrange', log, '+', '-', 'COUNT', 1)[1]
    if not top then return added end
    local last = top[1]
    local lt, ln = string.match(last, '^(%d+)%-(%d+)$')
    if tonumber(lt) > tonumber(term) then return 0 end
    prev, n = last, 1
    if tonumber(lt) == tonumber(term) then n = tonumber(ln) + 1 end
    id = term .. '-' .. string.format('%d', n)
    record = id .. ' ' .. since .. ' ' .. owner .. ' ' .. value
    redis.call('xadd', log, 'MAXLEN', '~', '1000', id, 'r', record)
  end
end
redis.call('set', rec_key, record)
local msg = prev .. ' ' .. record
local pub = ARGV[#ARGV]
if pub == 'spublish' or pub == 'SPUBLISH' then
  redis.pcall('spublish', channel, msg)
else
  redis.pcall('publish', channel, msg)
end
return id
