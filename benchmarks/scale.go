package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Scale: many locks in use at once, none contended. Each goroutine cycles
// Lock+Unlock on a lock of its own, back to back; the goroutines are spread
// over a few clients (separate connection pools), as a service's instances
// would hold one lock per order, account or job.

// scaleLayout is one size of the scale scenario: clients × goroutines each.
type scaleLayout struct{ Clients, PerClient int }

func (l scaleLayout) locks() int { return l.Clients * l.PerClient }

// scaleLayouts are the sizes measured: 1, 4, 64 and 1024 locks in use.
var scaleLayouts = []scaleLayout{{1, 1}, {4, 1}, {4, 16}, {4, 256}}

// scaleTarget is the size the target is checked at: 4 clients × 16 goroutines.
const scaleTarget = 64

// scaleLayoutOf returns the layout with locks in use.
func scaleLayoutOf(locks int) scaleLayout {
	for _, l := range scaleLayouts {
		if l.locks() == locks {
			return l
		}
	}
	panic(fmt.Sprintf("benchmarks: no scale layout of %d locks", locks))
}

// scaleResult is one variant at one size, over all rounds.
type scaleResult struct {
	Locks, Clients, PerClient int
	Cycles                    int64
	PerSecond                 float64   // median over rounds of cycles/s
	Rounds                    []float64 // cycles/s of each round
	perCycle                            // allocations of the whole process, round trips, commands, Redis CPU
	Errors                    int64
	FirstErr                  string
	spent                     spent
}

// scaleRound runs one round of v at layout l for the span sp and adds it to
// r: for a duration, or sp.ops cycles shared out evenly among the locks.
func scaleRound(v variant, srv *server, l scaleLayout, sp span, r *scaleResult) error {
	var w wire
	clients, err := connectAll(v, srv.config(&w), l.Clients)
	if err != nil {
		return err
	}
	defer closeAll(clients)
	ctx := context.Background()
	ms := make([]mutex, 0, l.locks())
	for _, cl := range clients {
		for range l.PerClient {
			m := cl.mutex(lockName("scale"))
			if err := cycleOnce(ctx, m); err != nil { // scripts loaded, connections open
				return err
			}
			ms = append(ms, m)
		}
	}
	c := &scaleRun{begin: make(chan struct{}), quota: int64(sp.ops / l.locks())}
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(ctx, m)
		}()
	}
	runtime.GC()
	meter := startMeter(srv, &w)
	start := time.Now()
	close(c.begin)
	if !sp.counting() {
		time.Sleep(sp.d)
		c.stop.Store(true)
	}
	wg.Wait()
	elapsed := time.Since(start)
	spent := meter.stop()
	if spent.err != nil {
		return spent.err
	}
	r.add(c, elapsed, spent)
	return nil
}

func cycleOnce(ctx context.Context, m mutex) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	return m.unlock(ctx)
}

// scaleRun is the goroutines of one round and what they counted.
type scaleRun struct {
	begin    chan struct{}
	quota    int64 // cycles of each goroutine; 0: until stop
	stop     atomic.Bool
	cycles   atomic.Int64
	errs     atomic.Int64
	firstErr atomic.Value // string
}

// work cycles m from begin until stop, or quota cycles. A failed cycle is
// counted and the goroutine goes on: the lock is its own, so the next Lock
// must succeed.
func (c *scaleRun) work(ctx context.Context, m mutex) {
	<-c.begin
	var n, tries int64
	for !c.stop.Load() && (c.quota == 0 || tries < c.quota) {
		tries++
		if err := cycleOnce(ctx, m); err != nil {
			c.errs.Add(1)
			c.firstErr.CompareAndSwap(nil, err.Error())
			continue
		}
		n++
	}
	c.cycles.Add(n)
}

// add sums up one round.
func (r *scaleResult) add(c *scaleRun, elapsed time.Duration, s spent) {
	n := c.cycles.Load()
	r.Cycles += n
	r.Rounds = append(r.Rounds, float64(n)/elapsed.Seconds())
	r.Errors += c.errs.Load()
	if e, ok := c.firstErr.Load().(string); ok && r.FirstErr == "" {
		r.FirstErr = e
	}
	r.spent = r.spent.add(s)
}

func (r *scaleResult) finish() {
	n := float64(r.Cycles)
	if n == 0 {
		return
	}
	rs := slices.Clone(r.Rounds)
	slices.Sort(rs)
	r.PerSecond = rs[len(rs)/2]
	r.perCycle = r.spent.per(n)
}

// runScale measures every variant that needs no polling at every size, the
// rounds interleaved so that a change in the machine's load touches all of
// them alike.
func (r *results) runScale(vs []variant, srv *server) {
	for _, l := range scaleLayouts {
		byName := map[string]*scaleResult{}
		r.Scale[strconv.Itoa(l.locks())] = byName
		for _, v := range vs {
			if v.held {
				byName[v.name] = &scaleResult{Locks: l.locks(), Clients: l.Clients, PerClient: l.PerClient}
			}
		}
		for round := range r.Plan.ScaleRounds {
			for _, v := range inTurn(vs, round) {
				if res := byName[v.name]; res != nil {
					if err := scaleRound(v, srv, l, span{d: r.Plan.ScaleTime}, res); err != nil {
						r.problem(v, fmt.Sprintf("scale %d", l.locks()), err)
					}
				}
			}
		}
		for _, v := range vs {
			res := byName[v.name]
			if res == nil {
				continue
			}
			res.finish()
			if res.Errors > 0 {
				r.problem(v, fmt.Sprintf("scale %d", l.locks()), fmt.Errorf("%d cycles failed, first: %s", res.Errors, res.FirstErr))
			}
			r.logf("scale %4d locks %-17s %8.0f cycles/s %6.1fµs Redis CPU/cycle %5.1f allocs %v",
				l.locks(), v.name, res.PerSecond, us(res.CPU), res.Allocs, roundsOf(res.Rounds))
		}
	}
}

// roundsOf shows the rates of rounds, in thousands per second.
func roundsOf(rs []float64) string {
	s := ""
	for i, x := range rs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.1fk", x/1000)
	}
	return s
}

// scaleOf returns a variant's result at the size with locks in use.
func (r *results) scaleOf(locks int) func(name string) (*scaleResult, bool) {
	return func(name string) (*scaleResult, bool) {
		res, ok := r.Scale[strconv.Itoa(locks)][name]
		return res, ok && res.Cycles > 0
	}
}

// scaleMetric returns the figure sel picks from each variant's result at the
// size with locks in use.
func (r *results) scaleMetric(locks int, sel func(*scaleResult) float64) metric {
	return metricOf(r.scaleOf(locks), sel)
}
