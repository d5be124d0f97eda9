package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/remutex/remutex"
)

// Counting instructions (-instructions): the scenarios run again, each for a
// fixed number of operations, on a redis-server run by callgrind (see
// callgrind.go), and every figure is the server's instructions per
// operation, serverCron's left out, beside the round trips, commands and
// allocations of the same operations. Each figure is counted in
// instrWindows windows, on fresh clients; an uncontended figure's windows
// must agree within instrAgreement. Then remutex's cycle and hand-off run
// once more on a server that dumps after every script call, for the cost of
// each script.
const (
	instrWindows      = 2
	instrCycles       = 500 // uncontended cycles per window
	instrAcquisitions = 300 // contended acquisitions per window (and the drain after it)
	instrScaleCycles  = 640 // cycles per window with scaleTarget locks in use: 10 per lock
	instrAgreement    = 0.005
)

// instrResults is everything counted under callgrind.
type instrResults struct {
	Valgrind    string
	FixedSeed   bool // the servers' hash seed was fixed (see callgrindCommand)
	Took        time.Duration
	Floor       *instrFigure            // two PINGs per cycle
	Uncontended map[string]*instrFigure // by variant
	Contended   map[string]*instrFigure
	Kinds       map[string]*instrFigure // remutex's primitives, uncontended
	Scale       map[string]*instrFigure // scaleTarget locks in use at once
	Scripts     map[string]*instrFigure // remutex per script call: "uncontended", "contended"
}

// instrFigure is one figure, counted in windows of the same operations.
type instrFigure struct {
	Ops       int       // operations per window
	Windows   []float64 // instructions per operation in each window
	Agreement float64   // (most - fewest) / mean of the windows
	PerSecond float64   // operations per second under callgrind, mean of the windows
	perCycle            // per operation, all windows
	Overlaps  int64     // contended: holders that found another inside
	Errors    int64

	spent spent
	n     float64
	rates []float64
}

// counted is what callgrind counted in a span: all the server's
// instructions, serverCron's (left out of the figures) and those inside
// script calls; on a server that dumps after every script call, per script
// and reply instead.
type counted struct {
	Total, Cron, Scripts int64
	calls                map[string]scriptStat
}

// scriptStat is the calls of one script that gave one reply: the
// instructions of each.
type scriptStat []int64

func (c counted) add(d counted) counted {
	s := counted{Total: c.Total + d.Total, Cron: c.Cron + d.Cron, Scripts: c.Scripts + d.Scripts, calls: maps.Clone(c.calls)}
	for k, v := range d.calls {
		if s.calls == nil {
			s.calls = map[string]scriptStat{}
		}
		s.calls[k] = append(slices.Clip(s.calls[k]), v...)
	}
	return s
}

// perOp is what the server executed per operation, under callgrind.
type perOp struct {
	Instructions float64               `json:",omitempty"` // serverCron's left out
	Cron         float64               `json:",omitempty"` // serverCron's, left out
	InScripts    float64               `json:",omitempty"` // inside script calls (EVAL, EVALSHA)
	Scripts      map[string]scriptCost `json:",omitempty"` // by "script reply"
}

// scriptCost is one script, by the reply it gave: its calls per operation
// and instructions per call. The mean is what the server pays; the median
// is a call without the garbage collection of Lua's heap, which runs in
// every 50th script call and wherever a call's allocations call for it.
type scriptCost struct{ Calls, Instructions, Median float64 }

func (c counted) per(n float64) perOp {
	p := perOp{Instructions: float64(c.Total-c.Cron) / n, Cron: float64(c.Cron) / n, InScripts: float64(c.Scripts) / n}
	for k, v := range c.calls {
		if p.Scripts == nil {
			p.Scripts = map[string]scriptCost{}
		}
		var sum int64
		for _, x := range v {
			sum += x
		}
		sorted := slices.Sorted(slices.Values(v))
		p.Scripts[k] = scriptCost{float64(len(v)) / n, float64(sum) / float64(len(v)), float64(sorted[len(sorted)/2])}
	}
	return p
}

// add takes in one window: n operations, what they spent, their rate.
func (f *instrFigure) add(n int, s spent, rate float64) {
	f.Windows = append(f.Windows, s.counted.per(float64(n)).Instructions)
	f.spent = f.spent.add(s)
	f.n += float64(n)
	f.rates = append(f.rates, rate)
}

func (f *instrFigure) finish() {
	f.perCycle = f.spent.per(f.n)
	for _, x := range f.rates {
		f.PerSecond += x / float64(len(f.rates))
	}
	if f.Instructions > 0 {
		f.Agreement = (slices.Max(f.Windows) - slices.Min(f.Windows)) / f.Instructions
	}
}

// window is one counted window of a figure: its operations, what they spent
// and their rate.
type window func() (n int, s spent, rate float64, err error)

// countWindows counts a figure of v in windows windows of ops operations.
// A window that fails is a problem of v's, and the figure is not reported.
func (r *results) countWindows(v variant, what string, ops, windows int, w window) *instrFigure {
	f := &instrFigure{Ops: ops}
	for range windows {
		n, s, rate, err := w()
		if err != nil {
			r.problem(v, "instructions, "+what, err)
			return nil
		}
		f.add(n, s, rate)
	}
	f.finish()
	// The uncontended cycle is the same work in every window. Under load,
	// the timing decides part of the work: how often a waiter polls, which
	// calls a client sends together; those figures vary by a percent or
	// more, and their windows are shown, not checked.
	if windows > 1 && f.Agreement > instrAgreement && what == "uncontended" {
		r.Problems = append(r.Problems, fmt.Sprintf("%s: instructions, %s: the windows differ by %.2f%% (%s)",
			v.name, what, 100*f.Agreement, kilo(f.Windows...)))
	}
	r.logf("instructions %-12s %-24s %8.1fk per op (windows %s), %.1fk in scripts, %.2f round trips",
		what, v.name, f.Instructions/1000, kilo(f.Windows...), f.InScripts/1000, f.Bursts)
	return f
}

// kilo shows instruction counts in thousands.
func kilo(xs ...float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.1fk", x/1000)
	}
	return strings.Join(s, " ")
}

// runInstructions counts two PINGs (the floor), every variant's uncontended
// cycle, contended acquisition and (for the variants of the scale scenario)
// cycle with scaleTarget locks in use, and remutex's primitives' cycles.
// Then it breaks remutex's cycle and hand-off down by script.
//
// Each variant (the floor, each primitive) has a fresh server of its own, so
// that its figures do not depend on what ran before them: a server's Lua
// heap, key space and allocator grow with every library's scripts and keys,
// and that moved one library's count by 2%. So the figures of a run with
// -libs are those of a full run.
func (r *results) runInstructions(vs []variant) error {
	t0 := time.Now()
	ir := &instrResults{Valgrind: valgrindVersion(), FixedSeed: fixedSeed(), Uncontended: map[string]*instrFigure{}, Contended: map[string]*instrFigure{},
		Kinds: map[string]*instrFigure{}, Scale: map[string]*instrFigure{}, Scripts: map[string]*instrFigure{}}
	r.Instructions = ir
	r.logf("instructions: redis-server under %s, a server per variant, fixed hash seed: %v", ir.Valgrind, ir.FixedSeed)
	if !ir.FixedSeed {
		r.Problems = append(r.Problems, "instructions: the servers' hash seed could not be fixed (needs root: unshare --mount): "+
			"a figure may differ by up to 1% from one run to the next")
	}
	keep := func(m map[string]*instrFigure, name string, f *instrFigure) {
		if f != nil {
			m[name] = f
		}
	}
	err := r.onCallgrind(false, func(srv *server) { ir.Floor = r.countCycles(pingFloor(), srv, instrWindows) })
	for _, v := range vs {
		err = errors.Join(err, r.onCallgrind(false, func(srv *server) {
			keep(ir.Uncontended, v.name, r.countCycles(v, srv, instrWindows))
			keep(ir.Contended, v.name, r.countContended(v, srv, instrWindows))
			if v.held {
				keep(ir.Scale, v.name, r.countScale(v, srv))
			}
		}))
	}
	for _, v := range lockKinds() {
		err = errors.Join(err, r.onCallgrind(false, func(srv *server) { keep(ir.Kinds, v.name, r.countCycles(v, srv, instrWindows)) }))
	}
	for _, v := range vs {
		if v.remutex {
			err = errors.Join(err, r.onCallgrind(true, func(srv *server) {
				keep(ir.Scripts, "uncontended", r.countCycles(v, srv, 1))
				keep(ir.Scripts, "contended", r.countContended(v, srv, 1))
			}))
		}
	}
	ir.Took = time.Since(t0)
	return err
}

// onCallgrind runs f on a fresh server under callgrind (see startCallgrind),
// warmed up, and stops the server.
func (r *results) onCallgrind(perCall bool, f func(*server)) error {
	srv, err := startCallgrind(perCall)
	if err != nil {
		return err
	}
	// Lock names are numbered from 1 on every server, as in every run,
	// whatever ran before: a key's name decides its bucket.
	nameSeq.Store(0)
	running.add(srv)
	defer running.remove(srv)
	defer srv.stop()
	if err := warmServer(srv); err != nil {
		return err
	}
	f(srv)
	return nil
}

// lockKinds are remutex's primitives whose uncontended cycles are counted
// beside DistMutex's: one more primitive is one more remutexKind here.
func lockKinds() []variant { return append(rwVariants(), onceVariant()) }

// onceKind is the name of a DistOnce's Do that finds the done record among
// remutex's primitives.
const onceKind = "DistOnce Do (found)"

// onceVariant is a DistOnce's Do that finds the done record, as a cycle: a
// Do of a new value each time (a value that saw the record returns with no
// command), on a once done before the cycles begin.
func onceVariant() variant {
	return remutexKind(onceKind, func(c *remutex.Client, n string) mutex {
		_ = c.NewOnce(n).Do(context.Background(), noRun) // (an error shows in the cycles)
		return onceFound{c: c, name: n}
	})
}

func noRun(context.Context) error { return nil }

// onceFound is onceVariant's mutex: lock is the Do, unlock nothing.
type onceFound struct {
	c    *remutex.Client
	name string
}

func (o onceFound) lock(ctx context.Context) error            { return o.c.NewOnce(o.name).Do(ctx, noRun) }
func (o onceFound) unlock(context.Context) error              { return nil }
func (o onceFound) tryLock(ctx context.Context) (bool, error) { return true, o.lock(ctx) }
func (o onceFound) lost() bool                                { return false }

func (r *results) countCycles(v variant, srv *server, windows int) *instrFigure {
	return r.countWindows(v, "uncontended", instrCycles, windows, func() (int, spent, float64, error) {
		c := &cycleResult{}
		if err := uncontendedRound(v, srv, span{ops: instrCycles}, c); err != nil {
			return 0, spent{}, 0, err
		}
		c.finish()
		return c.Cycles, c.spent, 1 / c.Cycle.Seconds(), nil
	})
}

// countContended counts the hand-off; an overlap is a violation here too.
func (r *results) countContended(v variant, srv *server, windows int) *instrFigure {
	var overlaps, errs int64
	f := r.countWindows(v, "contended", instrAcquisitions, windows, func() (int, spent, float64, error) {
		c, err := contended(v, srv, span{ops: instrAcquisitions})
		overlaps, errs = overlaps+c.Overlaps, errs+c.Errors
		return c.AllAcq, c.spent, c.PerSecond, err
	})
	if overlaps > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%s: contended under callgrind: %d acquisitions overlapped another holder", v.name, overlaps))
	}
	if f != nil {
		f.Overlaps, f.Errors = overlaps, errs
	}
	return f
}

func (r *results) countScale(v variant, srv *server) *instrFigure {
	l := scaleLayoutOf(scaleTarget)
	return r.countWindows(v, fmt.Sprintf("%d locks", l.locks()), instrScaleCycles, instrWindows, func() (int, spent, float64, error) {
		res := &scaleResult{}
		if err := scaleRound(v, srv, l, span{ops: instrScaleCycles}, res); err != nil {
			return 0, spent{}, 0, err
		}
		if res.Errors > 0 {
			return 0, spent{}, 0, fmt.Errorf("%d cycles failed, first: %s", res.Errors, res.FirstErr)
		}
		res.finish()
		return int(res.Cycles), res.spent, res.PerSecond, nil
	})
}

// warmServer sends a fresh server its first thousand commands, so that what
// it sets up once (its allocator's first pages of each size) falls in no
// window.
func warmServer(srv *server) error {
	var w wire
	rdb := goRedis(srv.config(&w))
	defer rdb.Close()
	for range 1000 {
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			return err
		}
	}
	return nil
}
