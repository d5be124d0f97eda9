-- Fragment, pasted where an entry script says --#include pub.lua.
-- Reads: ARGV[#ARGV] (the node's publish command).
-- Defines: pub, handoff, sharded.
--
-- The last argument of every lock script is the node's publish command:
-- 'publish', or 'spublish' on a Redis 7 cluster (these two, and 'pUBLISH'
-- below, begin in lower case: the lock is handed off); in capitals ('PUBLISH',
-- 'SPUBLISH': Redis reads commands in any case) on a quorum's servers,
-- whose queues never hand the lock on, only wake waiters (one argument
-- fewer: each costs the server about as much as a command). 'pUBLISH' is
-- 'publish' on a cluster on classic pub/sub (Redis 6.2, or a cluster that
-- could not be asked for SPUBLISH): there every node relays the message,
-- and a Client may listen on any of them.
-- Every command is named literally (proxies that vet scripts refuse a
-- command name held in a variable): the argument only chooses between them.
local pub = ARGV[#ARGV]
-- (Compared whole: Lua compares strings by reference, where string.byte
-- would be a library call.)
local handoff = pub == 'publish' or pub == 'spublish' or pub == 'pUBLISH'
local sharded = pub == 'spublish' or pub == 'SPUBLISH'
