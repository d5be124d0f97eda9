package robustness

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/lockcheck"
)

// Validation of the robustness test: the history the traffic records
// (a lockcheck.History, on the run's monotonic clock) is checked by
// lockcheck (see its package doc, and its tests for each check failing).
// What is checked here:
//
//   - Overlap: at no time do more holds believe they hold a lock than it
//     admits: two holds of a DistMutex, a DistRWMutex writer beside any other
//     hold, more permits of a DistSemaphore than its size. That is the lease
//     claim of docs/guarantees.md: a holder that loses its lease hears of it
//     (Lost) before anybody else can take the lock. Overlaps shorter than
//     the grace are not failed but counted as near misses: the recorder's
//     own wake-ups (the Lost watcher, the worker's return) are late by
//     about that much on a loaded machine.
//   - Fences: a hold taken after another returned has a larger fence; no
//     two holds share one.
//   - Minimum hold: after a WithMinHold hold was released (not lost), no
//     other Client takes the lock before the minimum hold has passed.
//     Unless its final release failed (UnlockContext returned an error,
//     Unlock told one to the handler, or Lost closed before the release
//     returned: the lease ran out while it was on its way, and a plain
//     Unlock reports that loss no more): such a release is sent again in the
//     background, and if that does not get through while the lease runs,
//     "the lock expires on the server within its lease" (UnlockContext's
//     doc), minimum hold or not: a holder cut off from Redis cannot keep
//     anything there. (The root's TestMinHoldKeptByAPostedRelease checks
//     that a posted release that gets through keeps the minimum hold.)
//   - Outcomes against Redis: right after an acquisition and before its
//     release the worker asks Redis through a fault-free Client (Inspect)
//     whether the hold it believes in is the one Redis has (same fence,
//     no other holder; a reader: no writer); a mismatch while its Lost
//     stays open is a violation (a differing hold count is only logged:
//     counts are absolute, and a cut-off nested call may leave Redis one
//     ahead until the next call sets it).
//     Calls that report what cannot be (ErrNotHeld or a panic for a hold
//     the goroutine has) are violations too.
//   - Liveness at the end: once faults are healed and every worker has
//     released, every lock is free again within its lease (and minimum
//     hold), and no worker is stuck in a call.
//
// Not checked: holds that were live when Redis restarted, from the restart
// on (docs/guarantees.md: holders learn of the loss at their next renewal;
// fencing is what covers that window); which waiter gets a lock (fairness);
// how late a call returns after its deadline; read holds' fences (they are
// the latest write's token, shared by design); that a semaphore's probe
// found this very acquisition (its owner token is not public): only that
// Redis has at least its permits out and has handed out its fence.

// check checks the run's history, open holds counting until end.
func (env *robustEnv) check(end time.Duration) (bad, near []lockcheck.Violation) {
	return env.hist.Check(lockcheck.Limits{Size: map[string]int64{"semaphore sem": env.cfg.semSize}, Grace: env.grace, End: end})
}

// robustSection is how long the second holder of
// TestRobustCheckerCatchesIgnoredLost holds: longer than the grace, so that
// an overlap is a violation.
const robustSection = 100 * time.Millisecond

// TestRobustCheckerCatchesIgnoredLost runs the checker on a real history:
// a holder is cut off until its lease runs out and another Client takes the
// lock. Recorded honestly (its Lost watched), that is no violation; by a
// fake holder that ignores Lost, it is an overlap.
func TestRobustCheckerCatchesIgnoredLost(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoreLost=%v", ignore), func(t *testing.T) {
			env := newRobustEnv(t, 1, 2, 1)
			a := newRobustWorker(env, env.clients[0], 1, 1)
			b := newRobustWorker(env, env.clients[1], 1, 1)
			la, lb := env.clients[0].m[0], env.clients[1].m[0]
			la.ignoreLost = ignore
			invoke, ret, err := a.call("m.A.Lock()", func() error { la.lock(); return nil })
			if err != nil {
				t.Fatal(err)
			}
			a.took(la, "m.A.Lock()", invoke, ret, la.lost(), la.fence(), 0)
			lost := la.lost()
			env.links[0].proxy.Pause() // a is cut off: its lease runs out
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			invoke, ret, err = b.call("m.A.LockContext(10s)", func() error { return lb.lockCtx(ctx) })
			if err != nil {
				t.Fatalf("b's LockContext: %v", err)
			}
			b.took(lb, "m.A.LockContext(10s)", invoke, ret, lb.lost(), lb.fence(), 0)
			<-lost // (a's Lost is closed by now: b holds)
			time.Sleep(robustSection)
			env.links[0].proxy.Resume()
			a.release(la)
			b.release(lb)
			bad, _ := env.check(env.hist.Now())
			var overlaps []lockcheck.Violation
			for _, v := range bad {
				if v.Kind == lockcheck.KindOverlap {
					overlaps = append(overlaps, v)
				}
			}
			if ignore && len(overlaps) != 1 {
				t.Errorf("got %d overlaps, want 1: the fake holder ignored Lost\n%s", len(overlaps), env.hist.Timeline(0, time.Hour, nil))
			}
			if !ignore && len(overlaps) != 0 {
				t.Errorf("got overlaps %v, want none: a holds until its Lost closed\n%s", overlaps, env.hist.Timeline(0, time.Hour, nil))
			}
		})
	}
}
