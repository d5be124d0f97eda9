// Command benchmarks compares remutex with the Go Redis locks its users would
// otherwise pick: redsync, bsm/redislock and rueidislock, each with its
// defaults and with the tightest polling its options allow.
//
// It starts its own redis-server on 127.0.0.1 (or uses REDIS_ADDR), measures
// every library in one run and writes a Markdown report, an SVG chart and the
// raw numbers as JSON:
//
//	go run . -out results          # the full run, 5 to 7 minutes
//	go run . -short -out /tmp/x    # a few seconds per scenario, for CI
//
// Scenarios:
//
//	floor        PING answered on the same connection, one after the other
//	uncontended  Lock+Unlock on one client, with allocations per cycle
//	nested       a nested Lock+Unlock of a held lock (remutex only)
//	contended    4 clients × 2 goroutines on one lock, 1 ms critical section
//	held         10,000 locks held by one client for three lease periods
//	rw           remutex's primitives (remutex only): DistRWMutex's RLock+RUnlock and
//	             Lock+Unlock, DistSemaphore's Acquire(1)+Release(1), beside DistMutex's
//	             Lock+Unlock; and a read-heavy load on DistRWMutex and on DistMutex
//	semaphore    a DistSemaphore of 4 permits, 4 clients × 4 goroutines, hold 1 ms
//	             (remutex only): acquisitions/s, waits, the most holders at once
//	hooks        remutex's cycle with and without the OpenTelemetry adapter
//	scale        1, 4, 64, 1024 locks in use at once, each cycled by a goroutine of its own
//	handoff      two clients taking turns on one lock, the waiter idle 3 ms, beside a PUBLISH
//	             to an idle subscriber; goroutine switches per hand-off from a runtime trace
//	instructions (-instructions, not run by default) redis-server's instructions per
//	             operation under valgrind's callgrind: the uncontended cycle, the
//	             contended acquisition, remutex's primitives, 64 locks in use
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
	"syscall"
	"time"
)

// durations of one run.
type plan struct {
	Short           bool
	Floor           time.Duration
	Rounds          int
	RoundTime       time.Duration // uncontended, per variant and round
	Nested          time.Duration
	ContendedTime   time.Duration // window per variant, all rounds together
	ContendedRounds int           // contended: rounds per variant, the variants interleaved
	HeldLocks       int
	HeldLease       time.Duration
	TakeLimit       time.Duration // held scenario: time allowed for taking the locks
	ScaleRounds     int           // scale: rounds per variant and size
	ScaleTime       time.Duration // scale: window of one round
	HandoffRounds   int           // handoff: rounds, the variants and floors rotated
	HandoffTime     time.Duration // handoff: hand-offs of one variant in a round, after the warm-up
	HandoffTraced   int           // handoff: hand-offs traced for the goroutine switches
	AwaitLoad       float64       // the 1-minute load waited for before starting, 0 for none
}

func fullPlan() plan {
	return plan{Rounds: 10, RoundTime: 300 * time.Millisecond, Nested: 2 * time.Second,
		ContendedTime: 6 * time.Second, ContendedRounds: 3, HeldLocks: 10000, HeldLease: 2 * time.Second, TakeLimit: 30 * time.Second,
		ScaleRounds: 3, ScaleTime: time.Second, HandoffRounds: 10, HandoffTime: 300 * time.Millisecond, HandoffTraced: 300}
}

func shortPlan() plan {
	return plan{Short: true, Rounds: 3, RoundTime: 60 * time.Millisecond,
		Nested: 300 * time.Millisecond, ContendedTime: 900 * time.Millisecond, ContendedRounds: 1, HeldLocks: 1000,
		HeldLease: time.Second, TakeLimit: 3 * time.Second, ScaleRounds: 1, ScaleTime: 100 * time.Millisecond,
		HandoffRounds: 3, HandoffTime: 60 * time.Millisecond, HandoffTraced: 60}
}

// flags are the command line.
type flags struct {
	out, libs, scenarios, cpuprofile string
	short, instructions              bool
	held                             int
	awaitLoad                        float64
	timeout                          time.Duration
}

func parseFlags() flags {
	var f flags
	flag.StringVar(&f.out, "out", "results", "directory for results.md, results.svg and results.json")
	flag.BoolVar(&f.short, "short", false, "a few seconds per scenario (CI)")
	flag.BoolVar(&f.instructions, "instructions", false, "also count redis-server's instructions per operation under valgrind's callgrind "+
		"(the scenario instructions; a few minutes more; installs valgrind with apt-get, as root, if it is missing)")
	flag.StringVar(&f.libs, "libs", "", "comma-separated variant names to run (default: all)")
	flag.IntVar(&f.held, "held", 0, "locks in the held scenario (default 10000, 1000 with -short)")
	flag.Float64Var(&f.awaitLoad, "await-load", 0, "before measuring, wait up to 10 minutes for the 1-minute load average to drop below this (0: don't wait)")
	flag.StringVar(&f.scenarios, "scenarios", "uncontended,nested,contended,held,rw,semaphore,hooks,scale,handoff", "scenarios to run (instructions: see -instructions)")
	flag.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.DurationVar(&f.timeout, "timeout", 0, "give up after this long, printing every goroutine's stack (default 10m, 3m with -short)")
	flag.Parse()
	if f.timeout == 0 {
		f.timeout = 10 * time.Minute
		if f.short {
			f.timeout = 3 * time.Minute
		}
		if f.instructions || strings.Contains(f.scenarios, "instructions") {
			f.timeout += 10 * time.Minute
		}
	}
	return f
}

// plan returns the durations the flags ask for.
func (f flags) plan() plan {
	p := fullPlan()
	if f.short {
		p = shortPlan()
	}
	if f.held > 0 {
		p.HeldLocks = f.held
	}
	p.AwaitLoad = f.awaitLoad
	return p
}

func main() {
	f := parseFlags()
	if f.cpuprofile != "" {
		stop, err := startProfile(f.cpuprofile)
		if err != nil {
			fail(err)
		}
		defer stop()
	}
	guard(f.timeout, awaitTime(f.awaitLoad))
	vs, err := selectVariants(variants(), f.libs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	want := map[string]bool{"instructions": f.instructions}
	for _, s := range strings.Split(f.scenarios, ",") {
		want[strings.TrimSpace(s)] = true
	}
	if f.awaitLoad > 0 {
		awaitLoad(f.awaitLoad, awaitLimit)
	}

	res, err := run(f.plan(), vs, want)
	if err != nil {
		fail(err)
	}
	md := markdown(res)
	if err := write(f.out, res, md); err != nil {
		fail(err)
	}
	fmt.Print(md)
	fmt.Printf("\nwrote %s/results.{md,svg,json} in %s\n", f.out, res.Took.Round(time.Second))
	if len(res.Violations) > 0 {
		fmt.Fprintln(os.Stderr, "correctness violations:")
		for _, v := range res.Violations {
			fmt.Fprintln(os.Stderr, "  "+v)
		}
		os.Exit(1)
	}
}

// fail ends the program on an error that leaves no results.
func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchmarks:", err)
	os.Exit(1)
}

// startProfile starts a CPU profile of the run into file.
func startProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, err
	}
	return pprof.StopCPUProfile, nil
}

// guard stops the redis-server child when the program is interrupted, and
// ends a run that takes longer than limit: a library that hangs must not hang
// CI, so it reports where every goroutine was. The run may first wait up to
// await for a quiet machine.
func guard(limit, await time.Duration) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		running.stopAll()
		fmt.Fprintln(os.Stderr, "benchmarks:", sig)
		os.Exit(2)
	}()
	time.AfterFunc(limit+await, func() {
		buf := make([]byte, 16<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "benchmarks: still running after %v; goroutines:\n%s\n", limit, buf)
		running.stopAll()
		os.Exit(3)
	})
}

// selectVariants returns the variants named in the comma-separated list
// only, or all of them if it is empty.
func selectVariants(vs []variant, only string) ([]variant, error) {
	if only == "" {
		return vs, nil
	}
	keep := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		keep[strings.TrimSpace(n)] = true
	}
	var sel []variant
	for _, v := range vs {
		if keep[v.name] {
			sel = append(sel, v)
		}
	}
	if len(sel) == 0 {
		return nil, fmt.Errorf("no variant matches -libs; known: %s", variantNames(vs))
	}
	return sel, nil
}

// write writes the report md, the chart and the numbers of res to dir.
func write(dir string, res *results, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string][]byte{
		"results.md":   []byte(md),
		"results.svg":  []byte(chart(res)),
		"results.json": jsonOf(res),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// awaitTime is the most that -await-load adds to a run.
func awaitTime(load float64) time.Duration {
	if load > 0 {
		return awaitLimit
	}
	return 0
}

const awaitLimit = 10 * time.Minute

// running are the servers of the run, stopped by an interrupt or the
// timeout too.
var running serverSet

func variantNames(vs []variant) string {
	var names []string
	for _, v := range vs {
		names = append(names, v.name)
	}
	return strings.Join(names, ",")
}
