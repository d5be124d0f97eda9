package transport

import (
	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/scripts"
)

// The scripts are the only code that changes a lock's keys, and the protocol
// itself: see internal/scripts. Each one is told absolute counts (the count a
// goroutine has and the count it wants), so a call sent twice, because the
// reply to the first was lost, changes nothing the second time. They are
// loaded in this order (Check loads them all, in it).
var (
	inspectScript = load("inspect")
	checkScript   = load("check")

	// RenewScript is the watchdog's (see Node.Renew), RaiseScript a
	// quorum's fence write-back.
	RenewScript = load("renew")
	RaiseScript = load("raise")

	// The uncontended cycle of a DistMutex, of a DistRWMutex's readers and
	// of a DistSemaphore (see Quick).
	QuickLock, QuickRLock, QuickSem = load("quick_lock"), load("quick_rlock"), load("quick_sem")
	WakeScript, RWWake, SemWake     = load("wake"), load("rwwake"), load("sem_wake")

	// The scripts of each kind of lock: a DistMutex, the write and read
	// sides of a DistRWMutex, a DistSemaphore.
	MutexScripts = Scripts{load("acquire"), load("release"), load("leave")}
	WriteScripts = Scripts{load("wlock"), load("wunlock"), load("rwleave")}
	ReadScripts  = Scripts{load("rlock"), load("runlock"), WriteScripts.Leave}
	SemScripts   = Scripts{load("sem_acquire"), load("sem_release"), load("sem_leave")}
	// A DistOnce's lock is a DistMutex's whose final release records the
	// run's outcome; OnceScript reads and deletes the records.
	OnceScripts = Scripts{MutexScripts.Acquire, load("once_release"), MutexScripts.Leave}
	OnceScript  = load("once")
	// A DistElection's lock is a DistMutex's on keys of its own;
	// ElectScript publishes and reads its leader (the publish command
	// appended: see Script.Pub).
	ElectScript = loadPub("elect")
	// ElectPublish is ElectScript for its publication, which replicas
	// acknowledge under WithReplicaAck.
	ElectPublish = acked(ElectScript)
)

// Scripts are what a lock's holds and waiters run: acquire (or queue),
// release, and leave the queue.
type Scripts struct {
	Acquire, Release, Leave *Script
}

// Script is a script with its SHA and source boxed once, so that calls do
// not allocate to pass them.
type Script struct {
	Src, SHA interface{}
	hash     string
	// Pub: Backend.Script appends the node's publish command to its
	// arguments (see pub.lua), as the lock scripts' calls do.
	Pub bool
	// Acked: a write whose call Backend.Script pipelines with WAIT under
	// WithReplicaAck (ErrTooFewReplicas when too few acknowledged it).
	Acked bool
}

// load returns the script name of internal/scripts with its includes
// expanded, boxed for calls.
func load(name string) *Script {
	sc := NewScript(scripts.Source(name))
	all = append(all, sc)
	return sc
}

// loadPub is load for a script that publishes (see Script.Pub).
func loadPub(name string) *Script {
	sc := load(name)
	sc.Pub = true
	return sc
}

// acked returns sc marked Acked (not loaded again: its SHA is sc's).
func acked(sc *Script) *Script {
	c := *sc
	c.Acked = true
	return &c
}

// all are every script load made (Check loads them all).
var all []*Script

// NewScript boxes the script src for calls.
func NewScript(src string) *Script {
	h := redis.NewScript(src).Hash()
	return &Script{Src: src, SHA: h, hash: h}
}

// Hash returns the script's SHA1, as SCRIPT EXISTS knows it.
func (s *Script) Hash() string { return s.hash }
