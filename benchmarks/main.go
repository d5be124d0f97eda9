// Command benchmarks compares remutex with the Go Redis locks its users would
// otherwise pick: redsync, bsm/redislock and rueidislock, each with its
// defaults and with the tightest polling its options allow.
//
// It starts its own redis-server on 127.0.0.1 (or uses REDIS_ADDR), measures
// every library in one run and writes a Markdown report, an SVG chart and the
// raw numbers as JSON:
//
//	go run . -out results          # the full run, 3 to 5 minutes
//	go run . -short -out /tmp/x    # a few seconds per scenario, for CI
//
// Scenarios:
//
//	floor        PING answered on the same connection, one after the other
//	uncontended  Lock+Unlock on one client, with allocations per cycle
//	nested       a nested Lock+Unlock of a held lock (remutex only)
//	contended    4 clients × 2 goroutines on one lock, 1 ms critical section
//	held         10,000 locks held by one client for three lease periods
//
// The program exits non-zero only on a correctness violation: two holders at
// once, a tryLock that took a held lock, or a remutex hold lost while held.
// Targets are reported, not enforced: timing on a shared machine varies.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// durations of one run.
type plan struct {
	Short         bool
	Floor         time.Duration
	Rounds        int
	RoundTime     time.Duration // uncontended, per variant and round
	Nested        time.Duration
	ContendedTime time.Duration // window per variant
	HeldLocks     int
	HeldLease     time.Duration
	TakeLimit     time.Duration // held scenario: time allowed for taking the locks
	AwaitLoad     float64       // the 1-minute load waited for before starting, 0 for none
}

func fullPlan() plan {
	return plan{Rounds: 10, RoundTime: 300 * time.Millisecond, Nested: 2 * time.Second,
		ContendedTime: 6 * time.Second, HeldLocks: 10000, HeldLease: 2 * time.Second, TakeLimit: 30 * time.Second}
}

func shortPlan() plan {
	return plan{Short: true, Rounds: 5, RoundTime: 100 * time.Millisecond,
		Nested: 500 * time.Millisecond, ContendedTime: 1500 * time.Millisecond, HeldLocks: 1000,
		HeldLease: time.Second, TakeLimit: 3 * time.Second}
}

func main() {
	var (
		out      = flag.String("out", "results", "directory for results.md, results.svg and results.json")
		short    = flag.Bool("short", false, "a few seconds per scenario (CI)")
		only     = flag.String("libs", "", "comma-separated variant names to run (default: all)")
		held     = flag.Int("held", 0, "locks in the held scenario (default 10000, 1000 with -short)")
		awaitLd  = flag.Float64("await-load", 0, "before measuring, wait up to 10 minutes for the 1-minute load average to drop below this (0: don't wait)")
		scenario = flag.String("scenarios", "uncontended,nested,contended,held", "scenarios to run")
		cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
		limit    = flag.Duration("timeout", 0, "give up after this long, printing every goroutine's stack (default 10m, 3m with -short)")
	)
	flag.Parse()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	p := fullPlan()
	if *short {
		p = shortPlan()
	}
	if *held > 0 {
		p.HeldLocks = *held
	}
	if *limit == 0 {
		*limit = 10 * time.Minute
		if *short {
			*limit = 3 * time.Minute
		}
	}
	// Interrupted, stop the redis-server child all the same.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		if s := running.Load(); s != nil {
			s.stop()
		}
		fmt.Fprintln(os.Stderr, "benchmarks:", sig)
		os.Exit(2)
	}()
	// A library that hangs must not hang CI: report where everything was.
	time.AfterFunc(*limit+awaitTime(*awaitLd), func() {
		buf := make([]byte, 16<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "benchmarks: still running after %v; goroutines:\n%s\n", *limit, buf)
		if s := running.Load(); s != nil {
			s.stop()
		}
		os.Exit(3)
	})
	vs := variants()
	if *only != "" {
		keep := map[string]bool{}
		for _, n := range strings.Split(*only, ",") {
			keep[strings.TrimSpace(n)] = true
		}
		var sel []variant
		for _, v := range vs {
			if keep[v.name] {
				sel = append(sel, v)
			}
		}
		if len(sel) == 0 {
			fmt.Fprintln(os.Stderr, "no variant matches -libs; known:", variantNames(vs))
			os.Exit(2)
		}
		vs = sel
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*scenario, ",") {
		want[strings.TrimSpace(s)] = true
	}
	if *awaitLd > 0 {
		awaitLoad(*awaitLd, awaitLimit)
	}

	p.AwaitLoad = *awaitLd
	res, err := run(p, vs, want)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
	md := markdown(res)
	files := map[string][]byte{
		"results.md":   []byte(md),
		"results.svg":  []byte(chart(res)),
		"results.json": jsonOf(res),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(*out, name), b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks:", err)
			os.Exit(1)
		}
	}
	fmt.Print(md)
	fmt.Printf("\nwrote %s/results.{md,svg,json} in %s\n", *out, res.Took.Round(time.Second))
	if len(res.Violations) > 0 {
		fmt.Fprintln(os.Stderr, "correctness violations:")
		for _, v := range res.Violations {
			fmt.Fprintln(os.Stderr, "  "+v)
		}
		os.Exit(1)
	}
}

// awaitTime is the most that -await-load adds to a run.
func awaitTime(load float64) time.Duration {
	if load > 0 {
		return awaitLimit
	}
	return 0
}

const awaitLimit = 10 * time.Minute

// running is the server of the run, stopped by the timeout too.
var running atomic.Pointer[server]

func variantNames(vs []variant) string {
	var names []string
	for _, v := range vs {
		names = append(names, v.name)
	}
	return strings.Join(names, ",")
}

// results is everything one run measured.
type results struct {
	Machine     machine
	Plan        plan
	Started     time.Time
	Took        time.Duration
	Variants    []variantInfo
	Floor       floorResult
	Uncontended map[string]*cycleResult
	Nested      *nestedResult
	Contended   map[string]*contendedResult
	Held        map[string]*heldResult
	Violations  []string
	Problems    []string // errors of a peer that are not violations
}

type variantInfo struct {
	Name, Lib, Setup string
	Remutex          bool
}

func run(p plan, vs []variant, want map[string]bool) (*results, error) {
	res := &results{
		Plan:        p,
		Started:     time.Now(),
		Uncontended: map[string]*cycleResult{},
		Contended:   map[string]*contendedResult{},
		Held:        map[string]*heldResult{},
	}
	for _, v := range vs {
		res.Variants = append(res.Variants, variantInfo{v.name, v.lib, v.setup, v.remutex})
	}
	res.Machine = describeMachine()
	srv, err := startServer()
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	running.Store(srv)
	res.Machine.Redis = srv.version()
	res.Machine.RedisAddr = srv.addr
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%6.1fs] "+format+"\n", append([]any{time.Since(res.Started).Seconds()}, args...)...)
	}
	logf("redis-server %s on %s, load %s", res.Machine.Redis, srv.addr, res.Machine.LoadStart)

	for _, v := range vs {
		if err := checkExclusion(v, srv.addr); err != nil {
			res.Violations = append(res.Violations, fmt.Sprintf("%s: exclusion check: %v", v.name, err))
		}
	}

	if want["uncontended"] {
		for _, v := range vs {
			res.Uncontended[v.name] = &cycleResult{}
		}
		// Rounds go through every variant in turn, and through the floor, so
		// that a change in the machine's load touches all of them alike.
		for round := 0; round < p.Rounds; round++ {
			if err := floorRound(srv.addr, p.RoundTime, &res.Floor); err != nil {
				return nil, fmt.Errorf("floor: %w", err)
			}
			for _, v := range vs {
				if err := uncontendedRound(v, srv, p.RoundTime, res.Uncontended[v.name]); err != nil {
					res.problem(v, "uncontended", err)
				}
			}
		}
		res.Floor.finish()
		logf("floor: PING %v (go-redis), %v (bare socket)", res.Floor.RTT, res.Floor.Raw)
		for _, v := range vs {
			r := res.Uncontended[v.name]
			r.finish()
			logf("uncontended %-17s %8.1fµs/cycle %5.1f allocs", v.name, us(r.Cycle), r.Allocs)
		}
	}

	if want["nested"] {
		for _, v := range vs {
			if !v.remutex {
				continue
			}
			r, err := nested(v, srv, p.Nested)
			if err != nil {
				res.problem(v, "nested", err)
				continue
			}
			res.Nested = &r
			logf("nested %s: lock %v unlock %v, PING %v", v.name, r.Lock, r.Unlock, r.Ping)
		}
	}

	if res.Floor.RTT == 0 { // no uncontended rounds: measure the floor alone
		if err := floorRound(srv.addr, time.Second, &res.Floor); err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		res.Floor.finish()
	}

	if want["contended"] {
		for _, v := range vs {
			r, err := contended(v, srv, p.ContendedTime)
			if err != nil {
				res.problem(v, "contended", err)
				continue
			}
			res.Contended[v.name] = &r
			if r.Overlaps > 0 {
				res.Violations = append(res.Violations, fmt.Sprintf("%s: contended: %d acquisitions overlapped another holder", v.name, r.Overlaps))
			}
			if r.Errors > 0 {
				res.Problems = append(res.Problems, fmt.Sprintf("%s: contended: %d errors, first: %s", v.name, r.Errors, r.FirstErr))
			}
			logf("contended %-17s %6.0f acq/s util %5.1f%% p99 %v max %v", v.name, r.PerSecond, 100*r.Utilisation, r.WaitP99.Round(time.Microsecond), r.WaitMax.Round(time.Microsecond))
		}
	}

	if want["held"] {
		for _, v := range vs {
			if !v.held {
				continue
			}
			r, err := manyHeld(v, srv, p.HeldLocks, p.HeldLease, p.TakeLimit)
			if err != nil {
				res.problem(v, "held", err)
				continue
			}
			res.Held[v.name] = &r
			if v.remutex && r.Lost > 0 {
				res.Violations = append(res.Violations, fmt.Sprintf("%s: held: %d of %d holds lost while held", v.name, r.Lost, r.Locks))
			}
			logf("held %-17s %d round trips, %d commands, +%d goroutines, %d lost", v.name, r.Bursts, r.Commands, r.Goroutines, r.Lost)
		}
	}
	for _, v := range vs {
		if v.stalls != nil && v.stalls.Load() > 0 {
			res.Problems = append(res.Problems, fmt.Sprintf("%s: %d Lock calls waited more than %v without getting a free lock and were retried "+
				"(an attempt that times out on a free key waits for an invalidation that never comes)", v.name, v.stalls.Load(), rueidisStall))
		}
	}
	res.Machine.LoadEnd = loadavg()
	res.Took = time.Since(res.Started)
	return res, nil
}

// problem records a scenario a variant could not complete. For remutex that
// is a violation; for a peer it is reported.
func (r *results) problem(v variant, scenario string, err error) {
	msg := fmt.Sprintf("%s: %s: %v", v.name, scenario, err)
	if v.remutex {
		r.Violations = append(r.Violations, msg)
	} else {
		r.Problems = append(r.Problems, msg)
	}
	fmt.Fprintln(os.Stderr, msg)
}
