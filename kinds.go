package remutex

import (
	"github.com/remutex/remutex/internal/wire"

	"github.com/remutex/remutex/internal/transport"
)

// kind is one kind of lock, as data: its keys, its scripts, how its queue
// entries and renewals name it, its uncontended cycle, and what it asks of
// the deployment. The engine (acquire, wait, release, the watchdog) reads
// these fields and never asks which kind it serves; a new kind of lock is
// one more value here and a file of its own for its public type.
type kind struct {
	// keysOf returns its keys for a lock name under a prefix (see
	// wire.LockKeys): the hash, fence and queue first, in that order.
	keysOf func(prefix, name string) []string
	// home is the index in its keys of the key its holds live in, which
	// names the Client's state of the lock and the channel its waiters
	// hear on.
	home    int
	scripts *scriptSet
	// flag and fencedFlag mark its queue entries (see queue.lua), without
	// and with WithFencing.
	flag, fencedFlag string
	// renewTag is what renew.lua is told of its holds before the lease: ""
	// a hash field, "r" a reader of a DistRWMutex, "p" a semaphore's
	// holding.
	renewTag string
	unheld   string // the panic of an unlock that holds nothing
	read     bool   // the read side of a DistRWMutex: its operations are named "r..."
	// multi: a value may have many holds at once (a DistRWMutex's readers,
	// a semaphore's acquisitions), so a new hold does not replace one that
	// is still listed.
	multi bool
	// permits: it counts permits (a semaphore): its calls carry the lock's
	// size, and its queue entries the permits each waiter asks.
	permits bool
	// quick returns its uncontended cycle on its keys (see transport.Quick), nil
	// where it has none.
	quick func(q *transport.Quick, keys []string) *transport.Quick
	// records: its final release writes a record that outlives the lock (a
	// DistOnce's outcome). The release is acknowledged by replicas as a
	// grant is, and a waiter whose queue entry is gone reads the record
	// instead of queueing again.
	records bool
	// oneDeployment, when set, is why a quorum Client cannot keep this kind
	// (New... panics with it).
	oneDeployment string
}

// The kinds of lock.
var (
	mutexKind = &kind{keysOf: wire.LockKeys, scripts: mutexScripts, flag: "0", fencedFlag: "1",
		unheld: "remutex: unlock of unlocked mutex", quick: transport.MutexQuick}
	writeKind = &kind{keysOf: wire.RWKeys, scripts: writeScripts, flag: "w", fencedFlag: "W",
		unheld: "remutex: Unlock of unlocked DistRWMutex"}
	readKind = &kind{keysOf: wire.RWKeys, home: 3, scripts: readScripts, flag: "r", fencedFlag: "R",
		renewTag: "r", unheld: "remutex: RUnlock of unlocked DistRWMutex", read: true, multi: true, quick: transport.ReadQuick}
	semKind = &kind{keysOf: wire.SemKeys, scripts: semScripts, flag: "s", fencedFlag: "S",
		renewTag: "p", unheld: "remutex: Release of more permits than held by DistSemaphore", multi: true, permits: true,
		quick: transport.SemQuick,
		oneDeployment: "a quorum Client cannot bound a count by majorities " +
			"(three servers and two permits let three holders each win a majority): use a Client of one deployment"}
	// A DistOnce's lock is a mutex on keys of its own whose final release
	// records the run's outcome (once_release.lua).
	onceKind = &kind{keysOf: wire.OnceKeys, scripts: onceScripts, flag: "0", fencedFlag: "1",
		unheld: "remutex: unlock of unlocked mutex", quick: transport.MutexQuick, records: true,
		oneDeployment: "a quorum Client cannot keep \"done\" exact (its servers may lose their data " +
			"unpersisted, and a majority that read past the server that kept the record would run f again): " +
			"use a Client of one deployment"}
	// A DistElection's term is a mutex's hold on keys of its own, always
	// fenced (the token is the term); elect.lua publishes its value. It has
	// no quick cycle: its release is release.lua's, which hands the term to
	// the next candidate in the same call (the quick release would find the
	// queue, then call wake.lua: a second round trip before the hand-over).
	electKind = &kind{keysOf: wire.ElectKeys, scripts: mutexScripts, flag: "0", fencedFlag: "1",
		unheld: "remutex: Resign of an election not led",
		oneDeployment: "a quorum Client cannot keep a leader's published value in order (each server keeps " +
			"its own record and log, and a majority's view of them has no order): use a Client of one deployment"}
)

// refuseQuorum panics, for New<fn>, if c cannot keep a lock of kind k.
func (c *Client) refuseQuorum(fn string, k *kind) {
	if k.oneDeployment != "" && !c.be.Exact() {
		panic("remutex: " + fn + ": " + k.oneDeployment)
	}
}
