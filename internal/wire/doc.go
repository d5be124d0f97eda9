// Package wire holds the pure codecs of remutex's protocol: the names of a
// lock's keys and their cluster slot, the queue entries the scripts keep,
// and the messages a release sends to a waiter's Client. It does no I/O and
// knows no Redis client; the Lua side of each format is named where it is
// defined.
//
// Every format here is a contract between versions: a fleet upgrades one
// process at a time, so old and new Clients meet on one lock. Change none of
// them without a plan for that (tests/compat runs old and new code on one
// lock).
package wire
