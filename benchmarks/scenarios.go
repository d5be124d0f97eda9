// The scenarios are in files of their own (floor, uncontended, nested,
// contended, held); this one holds what they share: lock names, statistics,
// and the check that a variant excludes at all.

package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
)

// names hands out lock names used by no other scenario of the run.
var nameSeq atomic.Int64

func lockName(scenario string) string {
	return "bench:" + scenario + ":" + strconv.FormatInt(nameSeq.Add(1), 10)
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// errTwoHolders is the exclusion check's violation: another client's tryLock
// took a held lock.
var errTwoHolders = errors.New("tryLock took a lock held by another client")

// checkExclusion makes sure a variant excludes across clients: a lock held by
// one client cannot be taken by another's tryLock, and is free again after
// unlock. Only errTwoHolders breaks exclusion; any other error means the
// check could not finish (a peer's tryLock may time out on a loaded machine).
func checkExclusion(v variant, addr string) error {
	ctx := context.Background()
	var w wire
	a, err := v.connect(config{addr: addr, wire: &w})
	if err != nil {
		return err
	}
	defer a.close()
	b, err := v.connect(config{addr: addr, wire: &w})
	if err != nil {
		return err
	}
	defer b.close()
	name := lockName("check")
	ma, mb := a.mutex(name), b.mutex(name)
	if err := ma.lock(ctx); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	ok, err := mb.tryLock(ctx)
	if err != nil {
		return fmt.Errorf("tryLock of a held lock: %w", err)
	}
	if ok {
		return errTwoHolders
	}
	if err := ma.unlock(ctx); err != nil {
		return fmt.Errorf("unlock: %w", err)
	}
	// Some libraries announce the release asynchronously: allow a moment.
	for deadline := time.Now().Add(2 * time.Second); ; {
		ok, err = mb.tryLock(ctx)
		if err != nil {
			return fmt.Errorf("tryLock of a free lock: %w", err)
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ok {
		return errors.New("tryLock failed on a released lock")
	}
	return mb.unlock(ctx)
}

// span is how long a scenario measures: for a duration, or, counting
// instructions under callgrind, for a number of operations (where the server
// is 20 to 50 times slower than usual, and two counts compare only over the
// same operations).
type span struct {
	d   time.Duration
	ops int
}

func (s span) counting() bool { return s.ops > 0 }

// over reports whether a span that began elapsed ago and has done done
// operations is over.
func (s span) over(elapsed time.Duration, done int) bool {
	if s.counting() {
		return done >= s.ops
	}
	return elapsed >= s.d
}

// warmUp is how many operations go before the span: they load scripts, open
// connections and warm caches, and under callgrind each costs milliseconds.
func (s span) warmUp() int {
	if s.counting() {
		return 20
	}
	return 200
}

// drainLimit bounds the wait, after the span, for the goroutines that were
// still waiting when it ended.
func (s span) drainLimit() time.Duration {
	if s.counting() {
		return time.Minute
	}
	return 10 * time.Second
}

// meter measures a span of a scenario: heap allocations of the process,
// what the clients sent and what Redis did; under callgrind, also the
// instructions the server executed.
type meter struct {
	srv *server
	w   *wire
	ms0 runtime.MemStats
	u0  usage
	w0  wireSnapshot
	err error // counting the instructions failed
}

// spent is what a meter measured.
type spent struct {
	mallocs, heap uint64 // heap allocations and bytes
	used          usage  // Redis CPU and commands executed
	sent          wireSnapshot
	counted       counted // under callgrind
	err           error   // counting failed
}

// startMeter starts measuring the work of srv and of the clients counted by w.
// It asks Redis (INFO) before the instructions are counted, and reads the
// process's allocations last, so that neither asking Redis nor callgrind's
// controls are counted.
func startMeter(srv *server, w *wire) *meter {
	m := &meter{srv: srv, w: w, u0: srv.usage(), w0: w.snapshot()}
	if srv.cg != nil {
		m.err = srv.cg.begin()
	}
	runtime.ReadMemStats(&m.ms0)
	return m
}

// stop returns what was spent since startMeter; it reads the allocations
// first, for the same reason.
func (m *meter) stop() spent {
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	w1 := m.w.snapshot()
	var c counted
	if m.srv.cg != nil && m.err == nil {
		c, m.err = m.srv.cg.end()
	}
	u1 := m.srv.usage()
	return spent{
		mallocs: ms1.Mallocs - m.ms0.Mallocs,
		heap:    ms1.TotalAlloc - m.ms0.TotalAlloc,
		used:    u1.sub(m.u0),
		sent:    w1.sub(m.w0),
		counted: c,
		err:     m.err,
	}
}

// add sums two spans.
func (s spent) add(t spent) spent {
	if s.used.cmds == nil {
		s.used = usage{cmds: map[string]cmdStat{}}
	}
	return spent{mallocs: s.mallocs + t.mallocs, heap: s.heap + t.heap, used: s.used.add(t.used), sent: s.sent.add(t.sent),
		counted: s.counted.add(t.counted), err: errors.Join(s.err, t.err)}
}

// perCycle is what one cycle cost, on average.
type perCycle struct {
	Allocs   float64            // heap allocations per cycle (all goroutines)
	Bytes    float64            // heap bytes per cycle
	Bursts   float64            // write bursts (round trips) per cycle
	Commands float64            // commands sent per cycle
	Executed float64            // commands executed per cycle, inside scripts included
	CPU      time.Duration      // redis-server CPU per cycle
	Server   map[string]cmdStat // INFO commandstats over all cycles
	perOp                       // under callgrind
}

// per returns what s spent per cycle over n cycles.
func (s spent) per(n float64) perCycle {
	return perCycle{
		Allocs:   float64(s.mallocs) / n,
		Bytes:    float64(s.heap) / n,
		Bursts:   float64(s.sent.Bursts) / n,
		Commands: float64(s.sent.Commands) / n,
		Executed: float64(s.used.executed()) / n,
		CPU:      time.Duration(float64(s.used.cpu) / n),
		Server:   s.used.cmds,
		perOp:    s.counted.per(n),
	}
}
