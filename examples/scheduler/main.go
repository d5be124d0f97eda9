// Command scheduler runs a cron-style job on exactly one of several replicas:
// leader election with a remutex.DistMutex.
//
// Each replica has its own remutex Client and connection pool, standing for
// one process of a service deployed several times. Every replica tries to take
// the lock "scheduler:<run>"; the one that holds it is the leader and runs the
// job on every tick, the others wait in LockContext. The leader keeps the
// lock's Lost channel and stops the job the moment it closes.
//
// Part way through, the leader's process dies: its Client is closed and its
// code stops running. Its hold is lost (Lost closes, the job stops), and since
// nothing unlocks it, the lock expires on the server within its lease. A
// waiting replica then takes it and carries on. Ticks that fall in that window
// are skipped, as cron skips runs while the machine is down. (A leader that
// loses its hold while it lives, say because Redis was unreachable for longer
// than the lease, stops the job, unlocks and campaigns again.)
//
// The job also shows fencing: it records each tick with the leader's fencing
// token, in one script that refuses a token lower than the last one seen, so a
// leader that was paused past its lease could not record anything after its
// successor did.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/scheduler
//	go run ./examples/scheduler -replicas 5 -interval 50ms -ticks 40
//
// It exits with status 1 if a tick ran twice or no failover happened.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run of the scheduler.
type config struct {
	replicas int           // replicas competing for leadership, one Client each
	interval time.Duration // between job ticks
	ticks    int           // ticks in the run
	failAt   int           // the leader dies after this tick (or the first after it that runs)
	lease    time.Duration // the lock's lease: the longest a failover waits
}

func main() {
	var cfg config
	flag.IntVar(&cfg.replicas, "replicas", 3, "replicas, each with its own remutex Client (processes)")
	flag.DurationVar(&cfg.interval, "interval", 100*time.Millisecond, "time between job ticks")
	flag.IntVar(&cfg.ticks, "ticks", 20, "ticks to run")
	flag.IntVar(&cfg.failAt, "fail-at", 5, "the leader dies after this tick (or the first one after it that runs)")
	flag.DurationVar(&cfg.lease, "lease", 500*time.Millisecond, "the leader lock's lease")
	flag.Parse()
	if cfg.replicas < 2 || cfg.interval <= 0 || cfg.failAt < 1 || cfg.ticks <= cfg.failAt || cfg.lease < remutex.MinLease {
		fmt.Fprintln(os.Stderr, "scheduler: need -replicas ≥ 2, -interval > 0, 1 ≤ -fail-at < -ticks, -lease ≥ 50ms")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
	if !sum.ok() {
		os.Exit(1)
	}
}

// summary is what a run did, read back from Redis.
type summary struct {
	ranBy      map[int]int // tick -> replica that ran it
	duplicates []int       // ticks that ran more than once
	firstLead  int         // the leader whose Client was closed
	nextLead   int         // the replica that took over (0 if none did)
	lastTick   int         // the last tick that ran
}

// ok reports whether every tick ran at most once and a failover happened,
// after which ticks ran again.
func (s summary) ok() bool {
	return len(s.duplicates) == 0 && s.nextLead != 0 && s.nextLead != s.firstLead && s.lastTick > 0 && s.ranBy[s.lastTick] == s.nextLead
}

// event is something a replica, or run, reports to the printer.
type event struct {
	kind    string // "elected", "tick", "again", "stale", "lost", "dead", "stopped"; "killed" from run
	replica int
	tick    int
	fence   int64
	err     error
	at      time.Time // "killed": when
}

// recordScript records that a tick ran: KEYS = last fence, runs (tick ->
// replica), attempts (tick -> count); ARGV = fence, tick, replica. It refuses
// a fence lower than the last one recorded (-1), and returns 1 for the first
// run of a tick, 0 for a repeated one.
var recordScript = redis.NewScript(`
local last = tonumber(redis.call('get', KEYS[1]) or '0')
if tonumber(ARGV[1]) < last then return -1 end
redis.call('set', KEYS[1], ARGV[1])
redis.call('hincrby', KEYS[3], ARGV[2], 1)
return redis.call('hsetnx', KEYS[2], ARGV[2], ARGV[3])
`)

// run runs the scheduler on the Redis at addr (an embedded miniredis if
// empty), prints what happens to out and returns what it did.
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
		addr, where = mr.Addr(), "embedded miniredis, its clock advanced in real time so that leases expire (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "scheduler: %d replicas (one Client each), a job every %v for %d ticks, leader lock lease %v\n",
		cfg.replicas, cfg.interval, cfg.ticks, cfg.lease)
	fmt.Fprintf(out, "redis:     %s\n", where)

	s := newScheduler(cfg)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	defer admin.Del(context.WithoutCancel(ctx), append(s.keys,
		remutex.DefaultKeyPrefix+"{"+s.lockName+"}", remutex.DefaultKeyPrefix+"{"+s.lockName+"}:fence")...)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reps := startReplicas(ctx, addr, cfg.replicas)
	defer reps.close()
	var wg sync.WaitGroup
	for i := range reps.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.replica(ctx, reps.procs[i], i+1, reps.clients[i], reps.rdbs[i])
		}()
	}
	p := startPrinter(out, cfg.failAt, s.events)

	var sum summary
	sum.firstLead = s.killLeader(ctx, p, reps)
	cancel()
	wg.Wait()
	close(s.events)
	<-p.done
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return summary{}, err
	}
	if err := s.readBack(context.WithoutCancel(ctx), admin, &sum); err != nil {
		return summary{}, err
	}
	select {
	case sum.nextLead = <-p.elected:
	default:
	}
	report(out, cfg, sum)
	return sum, nil
}

// replicas are the processes of the deployment: one pool, one Client and one
// context each; kill ends a process.
type replicas struct {
	rdbs      []*redis.Client
	clients   []*remutex.Client
	procs     []context.Context
	kills     []context.CancelFunc
	closeOnce []sync.Once
}

func startReplicas(ctx context.Context, addr string, n int) *replicas {
	r := &replicas{
		rdbs: make([]*redis.Client, n), clients: make([]*remutex.Client, n),
		procs: make([]context.Context, n), kills: make([]context.CancelFunc, n), closeOnce: make([]sync.Once, n),
	}
	for i := range n {
		r.rdbs[i] = redis.NewClient(&redis.Options{Addr: addr})
		// The example reports losses itself; without WithLogger they are
		// also logged at Warn.
		r.clients[i] = remutex.NewClient(r.rdbs[i], remutex.WithLogger(slog.New(slog.DiscardHandler)))
		r.procs[i], r.kills[i] = context.WithCancel(ctx)
	}
	return r
}

// kill ends process i: its code stops, and its Client with it.
func (r *replicas) kill(i int) {
	r.kills[i]()
	r.closeOnce[i].Do(func() { _ = r.clients[i].Close() })
}

// close ends every process, each Client before its pool.
func (r *replicas) close() {
	for i := len(r.rdbs) - 1; i >= 0; i-- {
		r.kill(i)
		_ = r.rdbs[i].Close()
	}
}

// killLeader waits until the leader has run tick failAt and kills its
// process, then waits for the end of the run. It returns the leader it
// killed, 0 if no tick ran by then.
func (s *scheduler) killLeader(ctx context.Context, p *printer, reps *replicas) int {
	end := time.NewTimer(time.Until(s.epoch.Add(time.Duration(s.cfg.ticks)*s.cfg.interval + s.cfg.interval/2)))
	defer end.Stop()
	leader := 0
	select {
	case leader = <-p.failNow:
		s.events <- event{kind: "killed", replica: leader, at: time.Now()}
		reps.kill(leader - 1)
	case <-end.C: // no tick ran by then: the summary says so
		return 0
	case <-ctx.Done():
	}
	// Let the run reach its last tick.
	select {
	case <-end.C:
	case <-ctx.Done():
	}
	return leader
}

// readBack reads from Redis which ticks ran, by whom, and which ran twice.
func (s *scheduler) readBack(ctx context.Context, admin *redis.Client, sum *summary) error {
	runs, err := admin.HGetAll(ctx, s.keys[1]).Result()
	if err != nil {
		return err
	}
	attempts, err := admin.HGetAll(ctx, s.keys[2]).Result()
	if err != nil {
		return err
	}
	sum.ranBy = map[int]int{}
	for k, v := range runs {
		tick, _ := strconv.Atoi(k)
		sum.ranBy[tick], _ = strconv.Atoi(v)
		sum.lastTick = max(sum.lastTick, tick)
	}
	for k, v := range attempts {
		if n, _ := strconv.Atoi(v); n > 1 {
			tick, _ := strconv.Atoi(k)
			sum.duplicates = append(sum.duplicates, tick)
		}
	}
	sort.Ints(sum.duplicates)
	return nil
}

// printer is the only goroutine that writes to out until the replicas are
// done. It tells run when tick failAt ran, and by whom, and who was elected
// after the leader was killed.
type printer struct {
	out     io.Writer
	failAt  int
	failNow chan int      // the leader that ran tick failAt (or the first after it that ran)
	elected chan int      // the leader elected after the old one was killed
	done    chan struct{} // closed once events is closed and printed
	killed  time.Time     // when the old leader was killed
	failing bool          // failNow was sent
}

func startPrinter(out io.Writer, failAt int, events <-chan event) *printer {
	p := &printer{out: out, failAt: failAt, failNow: make(chan int, 1), elected: make(chan int, 1), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for ev := range events {
			p.print(ev)
		}
	}()
	return p
}

func (p *printer) print(ev event) {
	name := fmt.Sprintf("replica-%d", ev.replica)
	switch ev.kind {
	case "elected":
		if p.killed.IsZero() {
			fmt.Fprintf(p.out, "%-10s elected leader (fencing token %d)\n", name, ev.fence)
			return
		}
		fmt.Fprintf(p.out, "%-10s elected leader (fencing token %d), %v after the old leader died\n",
			name, ev.fence, time.Since(p.killed).Round(time.Millisecond))
		select {
		case p.elected <- ev.replica:
		default:
		}
	case "tick":
		fmt.Fprintf(p.out, "tick %-5d run by %s\n", ev.tick, name)
		if ev.tick >= p.failAt && !p.failing {
			p.failing = true
			p.failNow <- ev.replica
		}
	case "killed":
		p.killed = ev.at
		fmt.Fprintf(p.out, "%-10s %s dies: its Client is closed and its code stops\n", "--", name)
	case "again":
		fmt.Fprintf(p.out, "tick %-5d run by %s AGAIN: it already ran\n", ev.tick, name)
	case "stale":
		fmt.Fprintf(p.out, "tick %-5d refused for %s: fencing token %d is stale\n", ev.tick, name, ev.fence)
	case "lost":
		fmt.Fprintf(p.out, "%-10s lost the lock, job stopped: %v\n", name, ev.err)
	case "dead":
		fmt.Fprintf(p.out, "%-10s Lost closed, job stopped; nothing unlocks, so the lock expires within its lease\n", name)
	case "stopped":
		fmt.Fprintf(p.out, "%-10s stopped: %v\n", name, ev.err)
	}
}

// report prints the summary of a run and the verdict.
func report(out io.Writer, cfg config, sum summary) {
	fmt.Fprintf(out, "summary:   %s\n", describe(cfg, sum))
	if sum.ok() {
		fmt.Fprintln(out, "verdict:   ok: one leader at a time, no tick ran twice, and a replica took over from the dead one")
	} else {
		fmt.Fprintln(out, "verdict:   FAIL: want every tick run at most once and a failover to another replica")
	}
}

// describe renders who ran which ticks: "1-5 by replica-2, 6-8 skipped, ...".
func describe(cfg config, s summary) string {
	var parts []string
	for t := 1; t <= cfg.ticks; {
		who, ran := s.ranBy[t]
		end := t
		for end+1 <= cfg.ticks {
			w, r := s.ranBy[end+1]
			if r != ran || w != who {
				break
			}
			end++
		}
		span := strconv.Itoa(t)
		if end > t {
			span += "-" + strconv.Itoa(end)
		}
		if ran {
			parts = append(parts, fmt.Sprintf("%s by replica-%d", span, who))
		} else {
			parts = append(parts, span+" skipped (no leader)")
		}
		t = end + 1
	}
	s2 := fmt.Sprintf("%d ticks: %s", cfg.ticks, strings.Join(parts, ", "))
	if len(s.duplicates) > 0 {
		return s2 + fmt.Sprintf("; ticks run twice: %v", s.duplicates)
	}
	return s2 + "; no tick ran twice"
}

// scheduler is the state the replicas share: the configuration and the
// schedule, as every process of a deployment would know them.
type scheduler struct {
	cfg      config
	lockName string
	keys     []string
	epoch    time.Time // tick k is due at epoch + k*interval
	events   chan event
}

// newScheduler returns the schedule of a run of its own, starting now: its
// lock and keys have a random name.
func newScheduler(cfg config) *scheduler {
	var id [6]byte
	_, _ = rand.Read(id[:])
	runID := hex.EncodeToString(id[:])
	tag := "{scheduler:" + runID + "}"
	return &scheduler{
		cfg: cfg, lockName: "scheduler:" + runID, keys: []string{tag + ":fence", tag + ":runs", tag + ":attempts"},
		epoch: time.Now(), events: make(chan event, 64),
	}
}

// replica is one process: it campaigns for the lock until the run ends, and
// leads while it holds the lock. proc ends when the process dies.
func (s *scheduler) replica(run, proc context.Context, id int, locks *remutex.Client, rdb *redis.Client) {
	m := locks.NewMutex(s.lockName, remutex.WithLease(s.cfg.lease), remutex.WithFencing())
	for {
		if err := m.LockContext(proc); err != nil {
			return // the run is over, or the process died
		}
		// Lost and Fence describe the calling goroutine's hold: ask here.
		lost, fence := m.Lost(), m.Fence()
		s.events <- event{kind: "elected", replica: id, fence: fence}
		s.lead(run, id, rdb, lost, fence)
		if proc.Err() != nil && run.Err() == nil {
			// The process died: it runs no more code, so nothing unlocks.
			s.events <- event{kind: "dead", replica: id}
			return
		}
		// Unlocking a lost hold reports ErrLockLost, and deletes what is
		// left of it in Redis: this leader has stopped working.
		if err := m.UnlockContext(context.WithoutCancel(run)); errors.Is(err, remutex.ErrLockLost) {
			s.events <- event{kind: "lost", replica: id, err: err}
		}
		if run.Err() != nil {
			return
		}
	}
}

// lead runs the job on every tick until the hold is lost, the last tick has
// passed, or ctx ends.
func (s *scheduler) lead(ctx context.Context, id int, rdb *redis.Client, lost <-chan struct{}, fence int64) {
	for {
		tick := int(time.Since(s.epoch)/s.cfg.interval) + 1
		if tick > s.cfg.ticks {
			select { // keep the lock until the run ends
			case <-ctx.Done():
			case <-lost:
			}
			return
		}
		t := time.NewTimer(time.Until(s.epoch.Add(time.Duration(tick) * s.cfg.interval)))
		select {
		case <-t.C:
		case <-lost:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			return
		}
		select {
		case <-lost: // lost while waiting for the tick: do not start the job
			return
		default:
		}
		s.job(ctx, id, rdb, tick, fence)
	}
}

// job is the cron job: here it records that tick ran, and who ran it.
func (s *scheduler) job(ctx context.Context, id int, rdb *redis.Client, tick int, fence int64) {
	res, err := recordScript.Run(ctx, rdb, s.keys, fence, tick, id).Int()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.events <- event{kind: "stopped", replica: id, err: err}
		}
	case res == -1:
		s.events <- event{kind: "stale", replica: id, tick: tick, fence: fence}
	case res == 0:
		s.events <- event{kind: "again", replica: id, tick: tick}
	default:
		s.events <- event{kind: "tick", replica: id, tick: tick}
	}
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
