package remutex

import "github.com/remutex/remutex/internal/transport"

// The scripts (see internal/scripts), as internal/transport boxes them for
// calls, under the engine's names.
var (
	renewScript = transport.RenewScript
	raiseScript = transport.RaiseScript

	quickLock, quickRLock, quickSem = transport.QuickLock, transport.QuickRLock, transport.QuickSem
	wakeScript, rwWake, semWake     = transport.WakeScript, transport.RWWake, transport.SemWake

	mutexScripts = newScriptSet(transport.MutexScripts)
	writeScripts = newScriptSet(transport.WriteScripts)
	readScripts  = newScriptSet(transport.ReadScripts)
	semScripts   = newScriptSet(transport.SemScripts)
	onceScripts  = newScriptSet(transport.OnceScripts)
	onceScript   = transport.OnceScript
	electScript  = transport.ElectScript
	electPublish = transport.ElectPublish
)

// luaScript is a script boxed for calls.
type luaScript = transport.Script

// scriptSet is what a lock's holds and waiters run: acquire (or queue),
// release, and leave the queue.
type scriptSet struct {
	acquire, release, leave *luaScript
}

func newScriptSet(s transport.Scripts) *scriptSet {
	return &scriptSet{s.Acquire, s.Release, s.Leave}
}

// set is s as a transport.Spec carries it.
func (s *scriptSet) set() transport.Scripts {
	return transport.Scripts{Acquire: s.acquire, Release: s.release, Leave: s.leave}
}
