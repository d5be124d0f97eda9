package partition

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/remutex/remutex/internal/lockcheck"
	"github.com/remutex/remutex/internal/redistest"
)

// The suite's history: what the holder processes report (see
// partitionRole), read into a lockcheck.History, and the check of it.

// The kinds of violations the suite records while it runs; the checks'
// are lockcheck's.
const (
	partIdle     = "lock not in use again after a heal"
	partChild    = "holder process"
	partObserver = "observer behind at the end"
)

// partHistory reads the holders' reports into a lockcheck.History, and
// tells the nemesis when the lock was taken.
type partHistory struct {
	*lockcheck.History
	kind string // the lock, as the holds name it

	mu    sync.Mutex
	holds map[string]*lockcheck.Hold // by holder process, goroutine and sequence number
	open  map[*lockcheck.Hold]bool   // held, neither lost nor released yet (as reported so far)
	last  time.Time                  // of the latest acquisition
	n     int                        // acquisitions
	kick  chan struct{}              // closed at an acquisition or an observation
	heals []time.Duration            // when the nemesis healed its cuts
}

func newPartHistory(kind string) *partHistory {
	return &partHistory{History: lockcheck.New(), kind: kind, holds: map[string]*lockcheck.Hold{},
		open: map[*lockcheck.Hold]bool{}, kick: make(chan struct{})}
}

func partTime(s string) time.Time {
	ns, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(0, ns)
}

// hold returns the hold of proc's goroutine g's lock call seq, recording it
// when first seen.
func (ph *partHistory) hold(proc, g, seq string) *lockcheck.Hold {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	key := fmt.Sprintf("%s.g%s.%s", proc, g, seq)
	hd := ph.holds[key]
	if hd == nil {
		hd = lockcheck.NewHold()
		hd.Res, hd.Who, hd.Client = ph.kind, key, proc
		ph.holds[key] = ph.AddHold(hd)
	}
	return hd
}

// add records one event of a holder process (see partitionRole,
// candidateRole and observerRole).
func (ph *partHistory) add(proc string, f []string) {
	if f[0] == "observe" && len(f) == 4 { // observe received term value
		ph.observe(proc, f)
		return
	}
	if len(f) < 4 {
		ph.Log(proc, "%s", strings.Join(f, " "))
		return
	}
	hd := ph.hold(proc, f[1], f[2])
	at := func(s string) string { return lockcheck.At(ph.Rel(partTime(s))) }
	var ev lockcheck.Event
	var opened, closed bool
	ph.Update(func() {
		switch f[0] {
		case "lock": // lock g seq mode call deadline ret err fence
			switch {
			case f[3] == "r":
				hd.Mode = lockcheck.Shared
			case ph.kind == "sem":
				hd.Mode, hd.Permits = lockcheck.Permits, 1
			}
			hd.Invoke, hd.Deadline, hd.Start = ph.Rel(partTime(f[4])), ph.Rel(partTime(f[5])), ph.Rel(partTime(f[6]))
			if f[7] != "nil" {
				hd.Err = f[7]
			}
			hd.Fence, _ = strconv.ParseInt(f[8], 10, 64)
			ev = lockcheck.Event{At: hd.Start, Who: proc, What: fmt.Sprintf("%s %s lock returned %s fence %d (called %s, deadline %s)",
				hd.Who, f[3], f[7], hd.Fence, at(f[4]), at(f[5]))}
			if len(f) > 9 { // an election's Campaign: ... value
				hd.Values = append(hd.Values, f[9])
				ev.What = fmt.Sprintf("%s campaign %s returned %s term %d (called %s, deadline %s)",
					hd.Who, f[9], f[7], hd.Fence, at(f[4]), at(f[5]))
			}
			opened = hd.Held()
		case "proclaim": // proclaim g seq call deadline ret err value
			hd.Values = append(hd.Values, f[7])
			ev = lockcheck.Event{At: ph.Rel(partTime(f[5])), Who: proc, What: fmt.Sprintf("%s proclaim %s returned %s (called %s, deadline %s)",
				hd.Who, f[7], f[6], at(f[3]), at(f[4]))}
		case "lost": // lost g seq at
			hd.LostAt = ph.Rel(partTime(f[3]))
			closed = true
			ev = lockcheck.Event{At: hd.LostAt, Who: proc, What: hd.Who + " Lost closed"}
		case "write": // write g seq op call ret res
			w := lockcheck.Write{Op: f[3], Call: ph.Rel(partTime(f[4])), Ret: ph.Rel(partTime(f[5])), Res: f[6]}
			hd.Writes = append(hd.Writes, w)
			ev = lockcheck.Event{At: w.Ret, Who: proc, What: fmt.Sprintf("%s register %s fence %d → %s (called %s)", hd.Who, w.Op, hd.Fence, w.Res, at(f[4]))}
		case "unlock": // unlock g seq mode call deadline ret err
			hd.ReleaseAt, hd.ReleaseDeadline, hd.ReleaseRet = ph.Rel(partTime(f[4])), ph.Rel(partTime(f[5])), ph.Rel(partTime(f[6]))
			if f[7] != "nil" {
				hd.ReleaseErr = f[7]
			}
			closed = true
			ev = lockcheck.Event{At: hd.ReleaseRet, Who: proc, What: fmt.Sprintf("%s unlock returned %s (called %s, deadline %s)",
				hd.Who, f[7], at(f[4]), at(f[5]))}
		default:
			ev = lockcheck.Event{At: ph.Now(), Who: proc, What: strings.Join(f, " ")}
		}
	})
	ph.Event(ev.At, ev.Who, ev.What)
	ph.mu.Lock()
	if opened {
		ph.open[hd] = true
	}
	if closed {
		delete(ph.open, hd)
	}
	if f[0] == "write" {
		ph.wake() // (see awaitFound)
	}
	ph.mu.Unlock()
	if f[0] == "lock" && f[7] == "nil" {
		ph.acquiredAt(partTime(f[6]))
	}
}

// observe records an observer's leader: observe received term value.
func (ph *partHistory) observe(proc string, f []string) {
	o := lockcheck.Observation{At: ph.Rel(partTime(f[1])), Who: proc, Res: ph.kind, Value: f[3]}
	o.Term, _ = strconv.ParseInt(f[2], 10, 64)
	ph.Observed(o)
	ph.Event(o.At, proc, fmt.Sprintf("observed term %d value %s", o.Term, o.Value))
	ph.mu.Lock()
	defer ph.mu.Unlock()
	ph.wake()
}

// wake wakes whoever waits for a change (under ph.mu).
func (ph *partHistory) wake() {
	close(ph.kick)
	ph.kick = make(chan struct{})
}

// healed records a heal of the nemesis at at.
func (ph *partHistory) healed(at time.Duration) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	ph.heals = append(ph.heals, at)
}

// all returns the holds recorded so far; their fields are read in
// Update.
func (ph *partHistory) all() []*lockcheck.Hold {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	holds := make([]*lockcheck.Hold, 0, len(ph.holds))
	for _, hd := range ph.holds {
		holds = append(holds, hd)
	}
	return holds
}

// topTerm returns the highest fence (an election's term) a lock call
// returned.
func (ph *partHistory) topTerm() int64 {
	holds := ph.all()
	var top int64
	ph.Update(func() {
		for _, hd := range holds {
			if hd.Held() {
				top = max(top, hd.Fence)
			}
		}
	})
	return top
}

// acquiredAt counts an acquisition that returned at ret, and wakes whoever
// waits for one.
func (ph *partHistory) acquiredAt(ret time.Time) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	ph.n++
	if ret.After(ph.last) {
		ph.last = ret
	}
	ph.wake()
}

func (ph *partHistory) changed() <-chan struct{} {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.kick
}

func (ph *partHistory) acquired() int {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	return ph.n
}

// waitAcquired waits until a lock call that returned after since holds,
// and reports whether one did within d.
func (ph *partHistory) waitAcquired(since time.Time, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ph.mu.Lock()
		ok, kick := !ph.last.Before(since), ph.kick
		ph.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-kick:
		case <-timer.C:
			return false
		}
	}
}

// waitLeading waits until a hold is open (an election's term: somebody
// leads), or a lock call that returned after since held, for at most d.
// It paces the nemesis; CheckLeading judges afterwards.
func (ph *partHistory) waitLeading(since time.Time, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ph.mu.Lock()
		ok, kick := len(ph.open) > 0 || !ph.last.Before(since), ph.kick
		ph.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-kick:
		case <-timer.C:
			return
		}
	}
}

// partRegisterLog is what the register saw.
type partRegisterLog struct {
	accepted []redistest.Write
	found    []redistest.Anomaly
}

// checkPartition checks a finished run's history and register with
// lockcheck (see its package doc):
//
//   - overlap (take-over): when a lock call returns held, fewer holds that
//     exclude it (capacity: 1, or the semaphore's permits) may be open
//     (returned, not yet unlocking) with Lost still open.
//     docs/guarantees.md: a hold's validity ends a drift margin before its
//     key can expire on the server, so its holder knows before anyone else
//     can take the lock; partSlack allows for the goroutine that
//     timestamps Lost;
//   - fences rise: a hold that returned after another (a semaphore's: whose
//     call began after another returned) has a larger fence, and no two
//     share one (read holds carry a writer's and are left out);
//   - the register accepted no overlap, no shared fence and no fence that
//     went back (the semaphore's: never more than its permits at once),
//     and refused only writes of holds already lost; no write failed;
//   - no lock or unlock call returned more than partLate past its
//     deadline;
//
// plus the violations recorded while the run went (the lock not in use
// again within partBack of a heal, holder processes that failed). An
// election's terms are its holds (exclusive, fenced by the term); its
// observers are checked by CheckObserved, and a term must count within
// partBack of every heal (CheckLeading).
func checkPartition(ph *partHistory, reg partRegisterLog) []lockcheck.Violation {
	if ph.kind == "elect" {
		lim := lockcheck.Limits{LostSlack: partSlack, Late: partLate, FencesByReturn: true}
		bad, _ := ph.Check(lim)
		bad = append(bad, ph.CheckRegister(reg.accepted, reg.found, 0)...)
		bad = append(bad, ph.CheckObserved()...)
		ph.mu.Lock()
		heals := slices.Clone(ph.heals)
		ph.mu.Unlock()
		return append(bad, ph.CheckLeading(ph.kind, heals, partBack, lim)...)
	}
	lim := lockcheck.Limits{LostSlack: partSlack, Late: partLate, FencesByReturn: ph.kind != "sem"}
	permits := 0
	if ph.kind == "sem" {
		permits = partPermits
		lim.Size = map[string]int64{ph.kind: partPermits}
	}
	bad, _ := ph.Check(lim) // no grace: no near misses
	return append(bad, ph.CheckRegister(reg.accepted, reg.found, permits)...)
}
