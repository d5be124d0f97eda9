package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex"
)

// The read/write lock (remutex only: no peer has one). Uncontended, an
// RLock+RUnlock cycle of DistRWMutex beside DistMutex's Lock+Unlock (and
// the cycles of remutex's other primitives: rwVariants). Then a
// read-heavy load, rwClients × rwPerClient goroutines each taking the lock
// for rwHold, one in rwWriteEvery operations a write: once on DistRWMutex
// (reads RLock), once on DistMutex (everything Locks), same load.
const (
	rwClients    = 4
	rwPerClient  = 4
	rwHold       = time.Millisecond
	rwWriteEvery = 20 // 95% reads
)

type rwResult struct {
	Cycle map[string]*cycleResult // by rwVariants' names: "DistMutex", "DistRWMutex RLock", ...
	Load  map[string]*rwLoad      // "DistMutex", "DistRWMutex"
}

// rwLoad is one run of the read-heavy load.
type rwLoad struct {
	Window       time.Duration
	Reads        int
	Writes       int
	PerSecond    float64 // operations (reads and writes) per second
	ReadWaitP99  time.Duration
	WriteWaitP50 time.Duration
	WriteWaitP99 time.Duration
	WriteWaitMax time.Duration
	CPU          time.Duration // redis-server CPU per acquisition
	Executed     float64       // commands executed per acquisition
	Violations   int64         // a writer with anyone else inside, a reader with a writer inside
	Errors       int64
}

// rwVariants are the uncontended cycles compared: remutex's primitives.
func rwVariants() []variant {
	return []variant{
		remutexKind("DistMutex", func(c *remutex.Client, n string) mutex { return &remutexMutex{m: c.NewMutex(n)} }),
		remutexKind("DistRWMutex RLock", func(c *remutex.Client, n string) mutex { return rwReader{c.NewRWMutex(n)} }),
		remutexKind("DistRWMutex Lock", func(c *remutex.Client, n string) mutex { return rwWriter{c.NewRWMutex(n)} }),
		remutexKind(semKind, func(c *remutex.Client, n string) mutex { return semPermit{c.NewSemaphore(n, semSize)} }),
	}
}

// remutexKind is one of remutex's primitives as a variant: pick makes its
// handle on a lock name, whose lock and unlock are the primitive's take and
// give back (RLock and RUnlock; a semaphore's Acquire(1) and Release(1)).
func remutexKind(name string, pick func(*remutex.Client, string) mutex) variant {
	return variant{name: name, lib: "remutex", remutex: true, connect: func(cfg config) (client, error) {
		rdb := goRedis(cfg)
		c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
		return &kindClient{remutexClient{rdb: rdb, c: c}, pick}, nil
	}}
}

type kindClient struct {
	remutexClient
	pick func(*remutex.Client, string) mutex
}

func (r *kindClient) mutex(name string) mutex { return r.pick(r.c, name) }

// rwReader and rwWriter are the two sides of a DistRWMutex as a mutex.
type rwReader struct{ rw *remutex.DistRWMutex }

func (m rwReader) lock(ctx context.Context) error            { return m.rw.RLockContext(ctx) }
func (m rwReader) unlock(ctx context.Context) error          { return m.rw.RUnlockContext(ctx) }
func (m rwReader) tryLock(ctx context.Context) (bool, error) { return m.rw.TryRLockContext(ctx) }
func (m rwReader) lost() bool                                { return isDone(m.rw.Lost()) }

type rwWriter struct{ rw *remutex.DistRWMutex }

func (m rwWriter) lock(ctx context.Context) error            { return m.rw.LockContext(ctx) }
func (m rwWriter) unlock(ctx context.Context) error          { return m.rw.UnlockContext(ctx) }
func (m rwWriter) tryLock(ctx context.Context) (bool, error) { return m.rw.TryLockContext(ctx) }
func (m rwWriter) lost() bool                                { return isDone(m.rw.Lost()) }

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (r *results) runRW(srv *server) {
	vs := rwVariants()
	res := &rwResult{Cycle: map[string]*cycleResult{}, Load: map[string]*rwLoad{}}
	for _, v := range vs {
		res.Cycle[v.name] = &cycleResult{}
	}
	for round := 0; round < r.Plan.Rounds; round++ {
		for _, v := range inTurn(vs, round) {
			if err := uncontendedRound(v, srv, span{d: r.Plan.RoundTime}, res.Cycle[v.name]); err != nil {
				r.problem(v, "rw uncontended", err)
			}
		}
	}
	for _, v := range vs {
		c := res.Cycle[v.name]
		c.finish()
		r.logf("rw uncontended %-24s %8.1fµs/cycle %4.2f round trips %5.1f allocs %5.1fµs Redis CPU", v.name, us(c.Cycle), c.Bursts, c.Allocs, us(c.CPU))
	}
	for _, rw := range []bool{false, true} {
		name := map[bool]string{false: "DistMutex", true: "DistRWMutex"}[rw]
		l, err := readHeavy(srv, rw, r.Plan.ContendedTime)
		if err != nil {
			r.problem(variant{name: name, remutex: true}, "read-heavy", err)
			continue
		}
		res.Load[name] = l
		if l.Violations > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: read-heavy: %d holders found a writer (or a writer found anyone) inside", name, l.Violations))
		}
		r.logf("read-heavy %-11s %7.0f ops/s, writer wait p99 %v, %5.1fµs Redis CPU/acq", name, l.PerSecond,
			l.WriteWaitP99.Round(time.Microsecond), us(l.CPU))
	}
	r.RW = res
}

// rwWork is the shared state of one read-heavy run.
type rwWork struct {
	activity   atomic.Int64 // readers add 1, writers rwWriterMark: sync's HammerRWMutex check
	violations atomic.Int64
	errs       atomic.Int64
	stop       atomic.Bool
	mu         sync.Mutex
	readWaits  []time.Duration
	writeWaits []time.Duration
}

const rwWriterMark = 10000

// readHeavy runs the load for window, on DistRWMutex (rw) or DistMutex.
func readHeavy(srv *server, rw bool, window time.Duration) (*rwLoad, error) {
	var w wire
	name := lockName("readheavy")
	var workers []func(ctx context.Context, write bool) (func(context.Context) error, error)
	for range rwClients {
		rdb := goRedis(srv.config(&w))
		defer rdb.Close()
		c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
		defer c.Close()
		for range rwPerClient {
			workers = append(workers, rwWorker(c, name, rw))
		}
	}
	var work rwWork
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	runtime.GC()
	meter := startMeter(srv, &w)
	start := time.Now()
	for i, f := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work.run(ctx, f, rand.New(rand.NewPCG(uint64(i), 1)))
		}()
	}
	time.Sleep(window)
	work.stop.Store(true)
	drain := time.AfterFunc(10*time.Second, cancel)
	wg.Wait()
	drain.Stop()
	took := time.Since(start)
	spent := meter.stop()
	return work.result(took, spent), nil
}

// rwWorker returns a worker's lock: lock(write) takes it and returns the
// unlock.
func rwWorker(c *remutex.Client, name string, rw bool) func(ctx context.Context, write bool) (func(context.Context) error, error) {
	if !rw {
		m := c.NewMutex(name)
		return func(ctx context.Context, _ bool) (func(context.Context) error, error) {
			return m.UnlockContext, m.LockContext(ctx)
		}
	}
	l := c.NewRWMutex(name)
	return func(ctx context.Context, write bool) (func(context.Context) error, error) {
		if write {
			return l.UnlockContext, l.LockContext(ctx)
		}
		return l.RUnlockContext, l.RLockContext(ctx)
	}
}

// run is one worker: operations until the window ends, one in rwWriteEvery
// (at random) a write.
func (work *rwWork) run(ctx context.Context, lock func(context.Context, bool) (func(context.Context) error, error), rnd *rand.Rand) {
	var reads, writes []time.Duration
	for !work.stop.Load() {
		write := rnd.IntN(rwWriteEvery) == 0
		t0 := time.Now()
		unlock, err := lock(ctx, write)
		if err != nil {
			work.errs.Add(1)
			continue
		}
		waited := time.Since(t0)
		work.inside(write)
		if err := unlock(context.Background()); err != nil {
			work.errs.Add(1)
		}
		if write {
			writes = append(writes, waited)
		} else {
			reads = append(reads, waited)
		}
	}
	work.mu.Lock()
	work.readWaits = append(work.readWaits, reads...)
	work.writeWaits = append(work.writeWaits, writes...)
	work.mu.Unlock()
}

// inside is the critical section, checked like sync's HammerRWMutex.
func (work *rwWork) inside(write bool) {
	add, bad := int64(1), func(n int64) bool { return n >= rwWriterMark }
	if write {
		add, bad = rwWriterMark, func(n int64) bool { return n != rwWriterMark }
	}
	if bad(work.activity.Add(add)) {
		work.violations.Add(1)
	}
	time.Sleep(rwHold)
	work.activity.Add(-add)
}

func (work *rwWork) result(took time.Duration, s spent) *rwLoad {
	slices.Sort(work.readWaits)
	slices.Sort(work.writeWaits)
	l := &rwLoad{Window: took, Reads: len(work.readWaits), Writes: len(work.writeWaits),
		Violations: work.violations.Load(), Errors: work.errs.Load()}
	n := l.Reads + l.Writes
	if n == 0 {
		return l
	}
	l.PerSecond = float64(n) / took.Seconds()
	l.ReadWaitP99 = percentile(work.readWaits, 0.99)
	l.WriteWaitP50 = percentile(work.writeWaits, 0.5)
	l.WriteWaitP99 = percentile(work.writeWaits, 0.99)
	if l.Writes > 0 {
		l.WriteWaitMax = work.writeWaits[l.Writes-1]
	}
	l.CPU = time.Duration(float64(s.used.cpu) / float64(n))
	l.Executed = float64(s.used.executed()) / float64(n)
	return l
}

// rwTargets are DistRWMutex's targets: against DistMutex in the same run.
func (r *results) rwTargets() []target {
	if r.RW == nil {
		return nil
	}
	var ts []target
	mc, rc := r.RW.Cycle["DistMutex"], r.RW.Cycle["DistRWMutex RLock"]
	if mc != nil && rc != nil && mc.Cycle > 0 {
		x := float64(rc.Cycle) / float64(mc.Cycle)
		ts = append(ts, target{What: "DistRWMutex: uncontended RLock+RUnlock cycle: time", Goal: "reported",
			Remutex: fmt.Sprintf("%.1f µs", us(rc.Cycle)), Peer: fmt.Sprintf("DistMutex %.1f µs", us(mc.Cycle)),
			Ratio: fmt.Sprintf("%.2f×", x)})
	}
	rw, mu := r.RW.Load["DistRWMutex"], r.RW.Load["DistMutex"]
	if rw == nil || mu == nil || mu.PerSecond == 0 {
		return ts
	}
	x := rw.PerSecond / mu.PerSecond
	return append(ts,
		target{What: fmt.Sprintf("read-heavy (%d×%d goroutines, %d%% reads, hold %v): throughput", rwClients, rwPerClient, 100-100/rwWriteEvery, rwHold),
			Goal: "≥ 3× DistMutex's", Remutex: fmt.Sprintf("%.0f ops/s", rw.PerSecond), Peer: fmt.Sprintf("DistMutex %.0f ops/s", mu.PerSecond),
			Ratio: fmt.Sprintf("%.2f×", x), Known: true, Met: x >= 3},
		target{What: "read-heavy: writer wait p99", Goal: "reported", Remutex: fmt.Sprintf("%.2f ms", ms(rw.WriteWaitP99)),
			Peer: fmt.Sprintf("DistMutex %.2f ms", ms(mu.WriteWaitP99))},
		target{What: "read-heavy: Redis CPU per acquisition (machine-dependent)", Goal: "reported", Remutex: fmt.Sprintf("%.1f µs", us(rw.CPU)),
			Peer: fmt.Sprintf("DistMutex %.1f µs", us(mu.CPU))},
		target{What: "read-heavy: holders that found a writer inside (or a writer anyone)", Goal: "0",
			Remutex: fmt.Sprint(rw.Violations), Known: true, Met: rw.Violations == 0 && mu.Violations == 0},
	)
}

func (w *page) rw(r *results) {
	if r.RW == nil {
		return
	}
	w.p("## (e) remutex's primitives; DistRWMutex under a read-heavy load (remutex)\n\n")
	w.p("Uncontended cycles of each primitive on one client, in rounds alternating with DistMutex's, each beginning with the next variant: "+
		"DistRWMutex's RLock+RUnlock and Lock+Unlock, DistSemaphore's Acquire(1)+Release(1) on a semaphore of %d permits. "+
		"Round trips are write bursts on the client's sockets; commands are sent, *executed* counts those run inside scripts.\n\n", semSize)
	w.p("| cycle | µs | p99 µs | round trips | commands | executed | allocs | Redis CPU µs |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range rwVariants() {
		if c := r.RW.Cycle[v.name]; c != nil {
			w.p("| %s | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f |\n", v.name, us(c.Cycle), us(c.P99), c.Bursts, c.Commands, c.Executed, c.Allocs, us(c.CPU))
		}
	}
	w.p("\nRead-heavy load: %d clients × %d goroutines on one lock, each operation held %v (time.Sleep), one in %d (at random) "+
		"a write; on DistRWMutex reads take RLock, on DistMutex every operation Locks. Waits are from the call until it held; "+
		"Redis CPU and commands are per acquisition.\n\n", rwClients, rwPerClient, rwHold, rwWriteEvery)
	w.p("| lock | ops/s | reads | writes | read wait p99 ms | writer wait p50 ms | p99 ms | max ms | Redis CPU µs | executed | violations | errors |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range []string{"DistRWMutex", "DistMutex"} {
		if l := r.RW.Load[name]; l != nil {
			w.p("| %s | %.0f | %d | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %d | %d |\n", name, l.PerSecond, l.Reads, l.Writes,
				ms(l.ReadWaitP99), ms(l.WriteWaitP50), ms(l.WriteWaitP99), ms(l.WriteWaitMax), us(l.CPU), l.Executed, l.Violations, l.Errors)
		}
	}
	w.p("\n")
}

// rwPanels chart DistRWMutex against DistMutex.
func rwPanels(r *results) []panel {
	if r.RW == nil {
		return nil
	}
	cyc := panel{title: "remutex's primitives: uncontended cycle (lower is better)", unit: "µs"}
	for _, v := range rwVariants() {
		if c := r.RW.Cycle[v.name]; c != nil && c.Cycle > 0 {
			cyc.bars = append(cyc.bars, bar{v.name, us(c.Cycle), v.name != "DistMutex"})
		}
	}
	load := panel{title: fmt.Sprintf("Read-heavy load, %d%% reads: operations per second (higher is better)", 100-100/rwWriteEvery), unit: "ops/s"}
	for _, name := range []string{"DistRWMutex", "DistMutex"} {
		if l := r.RW.Load[name]; l != nil && l.PerSecond > 0 {
			load.bars = append(load.bars, bar{name, l.PerSecond, name == "DistRWMutex"})
		}
	}
	return []panel{cyc, load}
}
