package main

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex"
)

// The counting semaphore (remutex only: no peer has one). Its uncontended
// cycle, Acquire(1)+Release(1) on a semaphore of semSize permits, is one of
// remutex's primitives (rwVariants). Contended: semClients × semPerClient
// goroutines on one semaphore of semSize permits, each goroutine holding a
// permit for semHold (time.Sleep) and pausing semPause after Release, as the
// mutex's hand-off does (contended.go). The goroutines of a Client share one
// DistSemaphore value, as those of a process share an x/sync Weighted.
const (
	semSize      = 4
	semClients   = 4
	semPerClient = 4
	semHold      = time.Millisecond
	semPause     = time.Millisecond
)

// semResult is one run of the contended semaphore.
type semResult struct {
	Size        int64
	Window      time.Duration
	Acquired    int     // acquisitions inside the window
	PerSecond   float64 // acquisitions per second, in the window
	Utilisation float64 // permit time held / (size × window)
	HoldMean    time.Duration
	WaitP50     time.Duration // Acquire called → returned, every acquisition
	WaitP99     time.Duration
	WaitMax     time.Duration
	MaxHolders  int64 // the most holders inside at once
	Violations  int64 // acquisitions that found Size holders inside already
	Errors      int64
	FirstErr    string
	AllAcq      int // acquisitions including the drain after the window
	perCycle        // per acquisition (AllAcq): round trips of all clients, commands, Redis CPU, allocations
}

// semPermit is one permit of a DistSemaphore as a mutex: the primitive's
// cycle is Acquire(1)+Release(1).
type semPermit struct{ s *remutex.DistSemaphore }

func (m semPermit) lock(ctx context.Context) error            { return m.s.Acquire(ctx, 1) }
func (m semPermit) unlock(ctx context.Context) error          { return m.s.ReleaseContext(ctx, 1) }
func (m semPermit) tryLock(ctx context.Context) (bool, error) { return m.s.TryAcquireContext(ctx, 1) }
func (m semPermit) lost() bool                                { return isDone(m.s.Lost()) }

func (r *results) runSemaphore(srv *server) {
	s, err := contendedSemaphore(srv, r.Plan.ContendedTime)
	if err != nil {
		r.problem(variant{name: "DistSemaphore", remutex: true}, "contended semaphore", err)
		return
	}
	r.Semaphore = s
	if s.Violations > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("DistSemaphore: contended: %d acquisitions found %d holders inside already (at most %d at once)",
			s.Violations, s.Size, s.MaxHolders))
	}
	if s.Errors > 0 {
		r.Problems = append(r.Problems, fmt.Sprintf("DistSemaphore: contended: %d errors, first: %s", s.Errors, s.FirstErr))
	}
	r.logf("contended DistSemaphore(%d) %6.0f acq/s util %5.1f%% p99 %v max %v, at most %d holders", s.Size, s.PerSecond, 100*s.Utilisation,
		s.WaitP99.Round(time.Microsecond), s.WaitMax.Round(time.Microsecond), s.MaxHolders)
}

// semWork is the shared state of one contended semaphore run.
type semWork struct {
	size       int64
	start      time.Time
	stop       atomic.Bool
	inside     atomic.Int64 // holders between Acquire's return and the Release call
	most       atomic.Int64
	violations atomic.Int64
	errs       atomic.Int64
	firstErr   atomic.Value // string
	mu         sync.Mutex
	records    []acqRecord // t0 Acquire called, t1 returned, t2 Release called
}

// contendedSemaphore runs the contended semaphore for window.
func contendedSemaphore(srv *server, window time.Duration) (*semResult, error) {
	var w wire
	name := lockName("semaphore")
	var sems []*remutex.DistSemaphore
	for range semClients {
		rdb := goRedis(srv.config(&w))
		defer rdb.Close()
		c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
		defer c.Close() // before rdb.Close
		sems = append(sems, c.NewSemaphore(name, semSize))
	}
	if err := warmSemaphore(sems); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	work := &semWork{size: semSize}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	runtime.GC()
	meter := startMeter(srv, &w)
	work.start = time.Now()
	for i := range semClients * semPerClient {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work.run(ctx, sems[i%semClients])
		}()
	}
	time.Sleep(window)
	work.stop.Store(true)
	drain := time.AfterFunc(10*time.Second, cancel) // a waiter still waiting then gives up
	wg.Wait()
	drain.Stop()
	spent := meter.stop()
	if spent.err != nil {
		return nil, spent.err
	}
	return work.result(window, spent)
}

// warmSemaphore has every worker take a permit once, all at once, so that
// the scripts of the contended path are loaded and the connections open
// before anything is measured.
func warmSemaphore(sems []*remutex.DistSemaphore) error {
	ctx := context.Background()
	errs := make(chan error, semClients*semPerClient)
	var wg sync.WaitGroup
	for i := range semClients * semPerClient {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := sems[i%semClients]
			err := s.Acquire(ctx, 1)
			if err == nil {
				time.Sleep(semHold)
				err = s.ReleaseContext(ctx, 1)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// run is one worker: Acquire(1), hold, Release(1), pause, until the window
// ends, each acquisition recorded.
func (work *semWork) run(ctx context.Context, s *remutex.DistSemaphore) {
	recs := make([]acqRecord, 0, 4096)
	defer func() {
		work.mu.Lock()
		work.records = append(work.records, recs...)
		work.mu.Unlock()
	}()
	for !work.stop.Load() {
		t0 := time.Since(work.start)
		if err := s.Acquire(ctx, 1); err != nil {
			if ctx.Err() != nil {
				return
			}
			work.fail(err)
			time.Sleep(semPause)
			continue
		}
		t1 := time.Since(work.start)
		work.enter()
		time.Sleep(semHold)
		work.inside.Add(-1)
		t2 := time.Since(work.start)
		if err := s.ReleaseContext(context.Background(), 1); err != nil {
			work.fail(err)
		}
		recs = append(recs, acqRecord{t0: t0, t1: t1, t2: t2})
		time.Sleep(semPause)
	}
}

// enter counts a holder in, and checks that it is at most the size'th: the
// count rises after Acquire returns and falls before Release is called, so
// it is never above the holders Redis knows of.
func (work *semWork) enter() {
	n := work.inside.Add(1)
	if n > work.size {
		work.violations.Add(1)
	}
	for m := work.most.Load(); n > m && !work.most.CompareAndSwap(m, n); m = work.most.Load() {
	}
}

func (work *semWork) fail(err error) {
	work.errs.Add(1)
	work.firstErr.CompareAndSwap(nil, err.Error())
}

// result sums the run up: rate and utilisation over the acquisitions inside
// the window, waits and costs over all of them.
func (work *semWork) result(window time.Duration, s spent) (*semResult, error) {
	res := &semResult{Size: work.size, Window: window, MaxHolders: work.most.Load(), Violations: work.violations.Load(),
		Errors: work.errs.Load(), AllAcq: len(work.records)}
	if e, ok := work.firstErr.Load().(string); ok {
		res.FirstErr = e
	}
	if res.AllAcq == 0 {
		return res, fmt.Errorf("no acquisition at all (%d errors, first: %s)", res.Errors, res.FirstErr)
	}
	waits := make([]time.Duration, 0, len(work.records))
	var held time.Duration
	for _, rec := range work.records {
		waits = append(waits, rec.t1-rec.t0)
		if rec.t1 < window {
			res.Acquired++
			held += min(rec.t2, window) - rec.t1
		}
	}
	slices.Sort(waits)
	res.WaitP50, res.WaitP99, res.WaitMax = percentile(waits, 0.5), percentile(waits, 0.99), waits[len(waits)-1]
	res.PerSecond = float64(res.Acquired) / window.Seconds()
	res.Utilisation = float64(held) / float64(time.Duration(work.size)*window)
	if res.Acquired > 0 {
		res.HoldMean = held / time.Duration(res.Acquired)
	}
	res.perCycle = s.per(float64(res.AllAcq))
	return res, nil
}

// semTargets are DistSemaphore's targets besides its instructions (see
// instrTargets): the round trips of its uncontended cycle, and the
// contended run.
func (r *results) semTargets() []target {
	var ts []target
	bursts := firstOf(
		metricOf(func(n string) (*cycleResult, bool) {
			if r.RW == nil {
				return nil, false
			}
			c, ok := r.RW.Cycle[n]
			return c, ok && c.Cycles > 0
		}, func(c *cycleResult) float64 { return c.Bursts }),
		metricOf(r.instrOf(kindsSet), func(f *instrFigure) float64 { return f.Bursts }))
	if x, ok := bursts(semKind); ok {
		ts = append(ts, target{What: "DistSemaphore Acquire(1)+Release(1): uncontended cycle, round trips", Goal: "2",
			Remutex: fmt.Sprintf("%.2f", x), Known: true, Met: x <= 2.005})
	}
	s := r.Semaphore
	if s == nil {
		return ts
	}
	what := fmt.Sprintf("contended semaphore (size %d, %d clients × %d goroutines, hold %v, pause %v): ", s.Size, semClients, semPerClient, semHold, semPause)
	return append(ts,
		target{What: what + "acquisitions per second, and permit utilisation", Goal: "reported",
			Remutex: fmt.Sprintf("%.0f acq/s, %.1f %%", s.PerSecond, 100*s.Utilisation)},
		target{What: "contended semaphore: holders never above the size", Goal: "0 violations",
			Remutex: fmt.Sprintf("%d violations, at most %d of %d inside at once", s.Violations, s.MaxHolders, s.Size),
			Known:   true, Met: s.Violations == 0 && s.MaxHolders <= s.Size},
		target{What: "contended semaphore: wait p99, wait max", Goal: "reported",
			Remutex: fmt.Sprintf("%.2f ms, %.2f ms", ms(s.WaitP99), ms(s.WaitMax))},
	)
}

// semKind is the name of the semaphore's cycle among remutex's primitives.
const semKind = "DistSemaphore Acquire(1)"

func (w *page) semaphore(r *results) {
	s := r.Semaphore
	if s == nil {
		return
	}
	w.p("## (h) Contended DistSemaphore (remutex)\n\n")
	w.p("One semaphore of %d permits, %d clients (separate connection pools) × %d goroutines for %v; the goroutines of a client share "+
		"one DistSemaphore value. A goroutine takes a permit (Acquire(1)), holds it %v (time.Sleep), releases it (Release(1)) and pauses %v. "+
		"*util* is permit time held over %d × wall time; *hold* the mean time from Acquire's return to the Release call; "+
		"*wait* runs from the Acquire call to its return; *most inside* is the most goroutines between Acquire's return and the "+
		"Release call at once (an atomic counter: it must never exceed %d), *violations* the acquisitions that found %d inside already "+
		"(must be 0). Per acquisition, the drain after the window included: round trips of all clients, commands sent and executed, "+
		"Redis CPU (INFO cpu, user+sys) and heap allocations of the process. The uncontended cycle is in (e).\n\n",
		s.Size, semClients, semPerClient, s.Window, semHold, semPause, s.Size, s.Size, s.Size)
	w.p("| semaphore | acq/s | util %% | hold µs | wait p50 ms | wait p99 ms | wait max ms | most inside | violations | errors | " +
		"round trips/acq | commands/acq | executed/acq | Redis CPU µs/acq (machine-dependent) | allocs/acq |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	w.p("| size %d | %.0f | %.1f | %.0f | %.2f | %.2f | %.2f | %d | %d | %d | %.2f | %.2f | %.1f | %.1f | %.1f |\n\n",
		s.Size, s.PerSecond, 100*s.Utilisation, us(s.HoldMean), ms(s.WaitP50), ms(s.WaitP99), ms(s.WaitMax), s.MaxHolders, s.Violations,
		s.Errors, s.Bursts, s.Commands, s.Executed, us(s.CPU), s.Allocs)
}
