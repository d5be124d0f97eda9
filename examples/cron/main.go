// Command cron runs the same scheduled job on several processes whose clocks
// differ, once under a plain remutex.DistMutex and once under one with a
// minimum hold (remutex.WithMinHold), and counts the runs of each tick.
//
// It is what happens when one cron line is installed on several machines:
// each starts the job at every tick of its own clock, and the clocks (and
// the schedulers' delays) differ by some milliseconds. Each of the -procs
// "processes" here is a goroutine with its own go-redis client and remutex
// Client; process p starts each tick (p-1) × -skew late. At its tick it
// tries the lock once (TryLock, as remutex run --wait 0 does), and if it got
// it, runs the job (it records its run in Redis and takes -job) and unlocks.
//
// A mutex excludes overlap, not repetition: with a plain DistMutex the job
// is done before the next process looks, so every process runs it, every
// tick. With WithMinHold(-min-hold) the lock stays taken until -min-hold
// after it was taken, so the later processes find it taken and skip the
// tick: the job runs once per tick, provided the minimum hold is longer than
// the skew and shorter than the tick. WithLease(-max-hold) and
// WithoutRenewal bound the hold from above, as remutex run --max-hold does:
// a process that died holding the lock would block the job that long at
// most.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server.
// miniredis expires keys only when its clock is moved, so the example moves
// it with the wall clock, every 5ms, while it runs: the minimum hold then
// ends in real time, as on a Redis server, to within those 5ms. The ticks
// are the wall clock's.
//
//	go run ./examples/cron
//	go run ./examples/cron -procs 5 -skew 20ms -period 200ms -ticks 6
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/cron
//
// It exits with status 1 if, with the minimum hold, some tick did not run
// exactly once.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run of the example.
type config struct {
	procs   int           // processes running the job, one Client each
	period  time.Duration // the tick
	ticks   int           // ticks in each schedule
	skew    time.Duration // how much later each process starts a tick than the one before
	job     time.Duration // how long the job takes
	minHold time.Duration // WithMinHold
	maxHold time.Duration // WithLease, with WithoutRenewal
}

func main() {
	var cfg config
	flag.IntVar(&cfg.procs, "procs", 3, "processes running the job, each with its own remutex Client")
	flag.DurationVar(&cfg.period, "period", 300*time.Millisecond, "time between ticks")
	flag.IntVar(&cfg.ticks, "ticks", 4, "ticks to run")
	flag.DurationVar(&cfg.skew, "skew", 40*time.Millisecond, "how much later each process starts a tick than the one before")
	flag.DurationVar(&cfg.job, "job", 5*time.Millisecond, "how long the job takes")
	flag.DurationVar(&cfg.minHold, "min-hold", 150*time.Millisecond, "WithMinHold: how long the lock stays taken after it was taken")
	flag.DurationVar(&cfg.maxHold, "max-hold", time.Second, "WithLease with WithoutRenewal: how long the lock is held at most")
	flag.Parse()
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(1)
	}
	if !sum.ok() {
		os.Exit(1)
	}
}

// check says what is wrong with cfg, or nil. Settings that break the
// once-per-tick rule (a minimum hold shorter than the skew, or longer than
// the tick) are allowed: the verdict then shows what they do.
func (cfg config) check() error {
	switch {
	case cfg.procs < 1 || cfg.ticks < 1 || cfg.period <= 0 || cfg.skew < 0 || cfg.job < 0:
		return errors.New("need -procs ≥ 1, -ticks ≥ 1, -period > 0, -skew ≥ 0, -job ≥ 0")
	case cfg.minHold < remutex.MinLease || cfg.maxHold > remutex.MaxLease || cfg.minHold > cfg.maxHold:
		return fmt.Errorf("need %v ≤ -min-hold ≤ -max-hold ≤ %v", remutex.MinLease, remutex.MaxLease)
	case cfg.job >= cfg.maxHold:
		return errors.New("need -job < -max-hold: a longer job outlives its hold")
	}
	return nil
}

// schedule is what one run of the schedule did: runs[k] lists the
// processes (numbered from 1) that ran the job at tick k+1, in the order
// they ran it.
type schedule struct {
	runs [][]int
}

// total is the number of runs in all ticks.
func (s schedule) total() int {
	n := 0
	for _, r := range s.runs {
		n += len(r)
	}
	return n
}

// once reports whether every tick ran exactly once.
func (s schedule) once() bool {
	for _, r := range s.runs {
		if len(r) != 1 {
			return false
		}
	}
	return true
}

// summary is what both schedules did.
type summary struct {
	plain, minHold schedule
}

// ok reports whether, with the minimum hold, the job ran once per tick.
func (s summary) ok() bool { return s.minHold.once() }

// run runs the schedule twice on the Redis at addr (an embedded miniredis if
// empty): under a plain DistMutex, then with a minimum hold. It prints what
// happened to out and returns it.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (summary, error) {
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return summary{}, err
		}
		defer mr.Close()
		stopClock := realTimeClock(mr)
		defer stopClock()
		addr, where = mr.Addr(), "embedded miniredis, its clock advanced in real time so that keys expire (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "cron:        %d processes (one Client each) run the same %v job every %v, %d ticks; they start each tick %s late\n",
		cfg.procs, cfg.job, cfg.period, cfg.ticks, lateness(cfg))
	fmt.Fprintf(out, "redis:       %s\n", where)

	var sum summary
	var err error
	if sum.plain, err = runSchedule(ctx, addr, cfg); err != nil {
		return summary{}, fmt.Errorf("plain DistMutex: %w", err)
	}
	fmt.Fprintln(out, "DistMutex:   a plain mutex: free again as soon as the job is done")
	printTicks(out, cfg, sum.plain)

	opts := []remutex.MutexOption{remutex.WithMinHold(cfg.minHold), remutex.WithLease(cfg.maxHold), remutex.WithoutRenewal()}
	if sum.minHold, err = runSchedule(ctx, addr, cfg, opts...); err != nil {
		return summary{}, fmt.Errorf("WithMinHold: %w", err)
	}
	fmt.Fprintf(out, "WithMinHold: WithMinHold(%v), WithLease(%v), WithoutRenewal(): taken for %v at least, %v at most\n",
		cfg.minHold, cfg.maxHold, cfg.minHold, cfg.maxHold)
	printTicks(out, cfg, sum.minHold)

	fmt.Fprintf(out, "verdict:     %s\n", verdict(cfg, sum))
	return sum, nil
}

// lateness lists how late each process starts a tick: "0s, 40ms, 80ms".
func lateness(cfg config) string {
	s := make([]string, cfg.procs)
	for p := range s {
		s[p] = (time.Duration(p) * cfg.skew).String()
	}
	return strings.Join(s, ", ")
}

// printTicks prints a line per tick: who ran the job, who skipped it.
func printTicks(out io.Writer, cfg config, s schedule) {
	for k, ran := range s.runs {
		line := "nobody ran it"
		if len(ran) > 0 {
			line = "ran on " + procList(ran)
		}
		var skipped []int
		for p := 1; p <= cfg.procs; p++ {
			if !slices.Contains(ran, p) {
				skipped = append(skipped, p)
			}
		}
		if len(ran) > 0 && len(skipped) > 0 {
			line += fmt.Sprintf(" (%s found the lock taken)", procList(skipped))
		}
		fmt.Fprintf(out, "  tick %-5d %s\n", k+1, line)
	}
}

// verdict judges the two schedules.
func verdict(cfg config, sum summary) string {
	switch {
	case !sum.ok():
		return fmt.Sprintf("FAIL: with the minimum hold the job should run once per tick; it ran %d times in %d ticks "+
			"(the minimum hold must outlast the skew, %v, and end before the next tick, %v)",
			sum.minHold.total(), cfg.ticks, time.Duration(cfg.procs-1)*cfg.skew, cfg.period)
	case sum.plain.once():
		return "ok: with the minimum hold the job ran once per tick (so did the plain mutex this time: try a larger -skew)"
	}
	return fmt.Sprintf("ok: with the minimum hold the job ran once per tick; with a plain DistMutex %d times in %d ticks",
		sum.plain.total(), cfg.ticks)
}

func procList(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = "p" + strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}

// runSchedule runs cfg.ticks ticks of the job on cfg.procs processes, each
// with its own go-redis client and remutex Client, on a lock of its own
// taken with opts, and reads back from Redis who ran which tick.
func runSchedule(ctx context.Context, addr string, cfg config, opts ...remutex.MutexOption) (schedule, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.ticks+1)*cfg.period+time.Minute)
	defer cancel()
	name := newRunName()
	logKey := name + ":runs"
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	defer admin.Del(context.WithoutCancel(ctx), logKey, remutex.DefaultKeyPrefix+"{"+name+"}")

	// The ticks begin a little after the processes are set up, all on the
	// same grid; process p starts each of them (p-1) × skew late.
	start := time.Now().Add(20 * time.Millisecond)
	errs := make([]error, cfg.procs)
	var wg sync.WaitGroup
	for p := range cfg.procs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		locks := remutex.NewClient(rdb)
		defer locks.Close() // before rdb.Close: deferred calls run last in, first out
		m := locks.NewMutex(name, opts...)
		late := time.Duration(p) * cfg.skew
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[p] = process(ctx, cfg, p+1, m, rdb, logKey, start.Add(late))
		}()
	}
	wg.Wait()
	for p, err := range errs {
		if err != nil {
			return schedule{}, fmt.Errorf("process p%d: %w", p+1, err)
		}
	}
	return readRuns(ctx, admin, logKey, cfg.ticks)
}

// process is process p: at each tick (the first at first, then every
// cfg.period) it tries m once, and if it got it, runs the job and unlocks.
// The job pushes "<tick> <p>" to the list logKey.
func process(ctx context.Context, cfg config, p int, m *remutex.DistMutex, rdb *redis.Client, logKey string, first time.Time) error {
	for k := range cfg.ticks {
		t := time.NewTimer(time.Until(first.Add(time.Duration(k) * cfg.period)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		got, err := m.TryLockContext(ctx)
		if err != nil {
			return err
		}
		if !got {
			continue // someone has run this tick's job, or runs it: skip
		}
		err = rdb.RPush(ctx, logKey, fmt.Sprintf("%d %d", k, p)).Err()
		time.Sleep(cfg.job) // the job's work
		// A minimum hold keeps the lock taken after this Unlock.
		if uerr := m.UnlockContext(context.WithoutCancel(ctx)); err == nil {
			err = uerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readRuns reads the runs the job recorded in the list logKey.
func readRuns(ctx context.Context, admin *redis.Client, logKey string, ticks int) (schedule, error) {
	log, err := admin.LRange(ctx, logKey, 0, -1).Result()
	if err != nil {
		return schedule{}, err
	}
	s := schedule{runs: make([][]int, ticks)}
	for _, e := range log {
		var k, p int
		if _, err := fmt.Sscan(e, &k, &p); err != nil || k < 0 || k >= ticks {
			return schedule{}, fmt.Errorf("run record %q: not <tick> <process>", e)
		}
		s.runs[k] = append(s.runs[k], p)
	}
	return s, nil
}

// newRunName returns a name for the lock and the keys of one schedule.
func newRunName() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return "cron:" + hex.EncodeToString(id[:])
}

// realTimeClock advances mr's clock with the wall clock, every 5ms, until
// stop is called: miniredis expires keys only when told that time passed.
func realTimeClock(mr *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case now := <-t.C:
				mr.FastForward(now.Sub(last))
				last = now
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-stopped }
}
