package remutex

import (
	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/scripts"
)

// The scripts are the only code that changes a lock's keys, and the protocol
// itself: see internal/scripts. Each one is told absolute counts (the count a
// goroutine has and the count it wants), so a call sent twice, because the
// reply to the first was lost, changes nothing the second time.
var (
	renewScript = loadScript("renew")
	raiseScript = loadScript("raise")

	// The uncontended cycle of a DistMutex, of a DistRWMutex's readers and
	// of a DistSemaphore (see quick).
	quickLock, quickRLock, quickSem = loadScript("quick_lock"), loadScript("quick_rlock"), loadScript("quick_sem")
	wakeScript, rwWake, semWake     = loadScript("wake"), loadScript("rwwake"), loadScript("sem_wake")

	// The scripts of each kind of lock: a DistMutex, and the write and read
	// sides of a DistRWMutex.
	mutexScripts = &scriptSet{loadScript("acquire"), loadScript("release"), loadScript("leave")}
	writeScripts = &scriptSet{loadScript("wlock"), loadScript("wunlock"), loadScript("rwleave")}
	readScripts  = &scriptSet{loadScript("rlock"), loadScript("runlock"), writeScripts.leave}
	semScripts   = &scriptSet{loadScript("sem_acquire"), loadScript("sem_release"), loadScript("sem_leave")}
	// A DistOnce's lock is a DistMutex's whose final release records the
	// run's outcome; once.lua reads and deletes the records.
	onceScripts = &scriptSet{mutexScripts.acquire, loadScript("once_release"), mutexScripts.leave}
	onceScript  = loadScript("once")
)

// scriptSet is what a lock's holds and waiters run: acquire (or queue),
// release, and leave the queue.
type scriptSet struct {
	acquire, release, leave *luaScript
}

// luaScript is a script with its SHA and source boxed once, so that calls do
// not allocate to pass them.
type luaScript struct {
	src, sha interface{}
	hash     string
}

// loadScript returns the script name of internal/scripts with its
// includes expanded, boxed for calls.
func loadScript(name string) *luaScript {
	sc := newLuaScript(scripts.Source(name))
	all = append(all, sc)
	return sc
}

// all are every script loadScript made (Client.Check loads them all).
var all []*luaScript

func allScripts() []*luaScript { return all }

func newLuaScript(src string) *luaScript {
	h := redis.NewScript(src).Hash()
	return &luaScript{src: src, sha: h, hash: h}
}

// Hash returns the script's SHA1, as SCRIPT EXISTS knows it.
func (s *luaScript) Hash() string { return s.hash }
