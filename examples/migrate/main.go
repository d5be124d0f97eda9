// Command migrate shows a remutex.DistOnce running a database migration once
// while a fleet of servers starts.
//
// -procs servers (each a remutex Client with its own connection pool, as
// pods would be) start at once, and none may serve before the migration
// has run. Each calls Do on the once "migrate:<version>" with the same
// migration: one of them runs it, the others wait for that run (woken by
// its end, not polling) and then serve. The migration is -steps steps,
// each recorded in the "database" (a Redis hash) with the run's fencing
// token; it resumes after the last step recorded, so that it can be run
// again after a crash (the way to make a once's f idempotent).
//
// In a second round, for a new version, the runner is killed mid-way: its
// process stops working and stops talking to Redis (all its commands fail
// from then on), as a SIGKILLed pod does. Its lease (-lease) ends, one of
// the waiters runs the migration instead, from the step the dead runner
// reached, and the others serve after it.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/migrate
//	go run ./examples/migrate -procs 8 -steps 10
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/migrate
//
// Its last line is a verdict; it exits with status 1 if a server served
// before its migration was complete, if a round ran the migration more or
// fewer times than it should, or if a step was applied twice.
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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run of the example.
type config struct {
	procs int           // servers starting at once, one Client each
	steps int           // steps of a migration
	step  time.Duration // how long a step takes
	lease time.Duration // the once's lease: how long a dead runner keeps the others waiting
}

func main() {
	var cfg config
	flag.IntVar(&cfg.procs, "procs", 5, "servers starting at once, each with its own remutex Client")
	flag.IntVar(&cfg.steps, "steps", 6, "steps of the migration")
	flag.DurationVar(&cfg.step, "step", 50*time.Millisecond, "how long a step of the migration takes")
	flag.DurationVar(&cfg.lease, "lease", time.Second, "the once's lease: how long a runner that died keeps the others waiting")
	flag.Parse()
	if cfg.procs < 2 || cfg.steps < 2 || cfg.step < 0 || cfg.lease < remutex.MinLease {
		fmt.Fprintf(os.Stderr, "migrate: need -procs ≥ 2, -steps ≥ 2, -step ≥ 0 and -lease ≥ %v\n", remutex.MinLease)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ok, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// round is what one round saw.
type round struct {
	runs      int           // runs of the migration started
	completed int           // of them, runs that finished it
	served    int           // servers that served after Do returned nil
	early     int           // servers that found the migration incomplete when they were to serve
	replayed  int           // steps applied again by a later run (must be 0)
	fences    []int64       // the fencing tokens of the runs, in order
	took      time.Duration // from the start to the last server serving
}

// run plays both rounds on the Redis at addr (an embedded miniredis if
// empty), prints the report to out, and reports whether both went right.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (bool, error) {
	where := "Redis at " + addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return false, err
		}
		defer mr.Close()
		defer realTimeClock(mr)()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "migrate:        %d servers start at once; none may serve before the migration (%d steps of %v) has run, once\n",
		cfg.procs, cfg.steps, cfg.step)
	fmt.Fprintf(out, "redis:          %s\n", where)
	id := newID()
	first, err := play(ctx, cfg, addr, "v42-"+id, -1)
	if err != nil {
		return false, fmt.Errorf("round 1: %w", err)
	}
	fmt.Fprintf(out, "round 1:        %s\n", first)
	kill := cfg.steps / 2
	second, err := play(ctx, cfg, addr, "v43-"+id, kill)
	if err != nil {
		return false, fmt.Errorf("round 2: %w", err)
	}
	fmt.Fprintf(out, "round 2:        the runner killed after step %d of %d; %s\n", kill, cfg.steps, second)
	ok := first.runs == 1 && first.completed == 1 && first.served == cfg.procs &&
		second.runs == 2 && second.completed == 1 && second.served == cfg.procs-1 &&
		first.early+second.early+first.replayed+second.replayed == 0 &&
		len(second.fences) == 2 && second.fences[1] > second.fences[0]
	if ok {
		fmt.Fprintf(out, "verdict:        ok: each migration ran to its end once; no server served before it; the dead runner's work was resumed, not redone, by one waiter with a higher fencing token\n")
	} else {
		fmt.Fprintf(out, "verdict:        FAIL: want round 1 one run and %d servers, round 2 two runs (one killed) and %d servers, none early, no step applied twice\n",
			cfg.procs, cfg.procs-1)
	}
	return ok, nil
}

func (r round) String() string {
	return fmt.Sprintf("%d run(s) started (fences %v), %d finished the migration; %d servers served after it, %d early; %d steps applied twice (%v)",
		r.runs, r.fences, r.completed, r.served, r.early, r.replayed, r.took.Round(time.Millisecond))
}

// play starts cfg.procs servers at once on migration version; with kill ≥
// 0, the server that runs it first dies after step kill.
func play(ctx context.Context, cfg config, addr, version string, kill int) (round, error) {
	db := redis.NewClient(&redis.Options{Addr: addr})
	defer db.Close()
	p := &player{cfg: cfg, addr: addr, db: db, version: version, dbKey: "migrate:db:" + version, kill: kill, start: time.Now()}
	defer db.Del(context.Background(), p.dbKey)
	defer func() {
		// The once's record is kept without expiry: an example leaves none.
		c := remutex.NewClient(db)
		defer c.Close()
		_ = c.NewOnce("migrate:" + version).Reset(context.Background())
	}()
	var wg sync.WaitGroup
	errs := make(chan error, cfg.procs)
	for i := range cfg.procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.server(ctx, i); err != nil {
				errs <- fmt.Errorf("server %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return p.r, errors.Join(collect(errs)...)
}

// player is one round: its servers and what they saw.
type player struct {
	cfg            config
	addr           string
	db             *redis.Client
	version, dbKey string
	kill           int // the step after which the first runner dies; -1 none
	start          time.Time
	killed         atomic.Bool // a runner has died already

	mu sync.Mutex
	r  round
}

// server is one server starting: it runs the migration once with the
// others, then serves if the migration is complete (a dead one serves
// nothing).
func (p *player) server(ctx context.Context, i int) error {
	dead := new(atomic.Bool) // this server's process is gone: its commands fail
	rdb := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	rdb.AddHook(deadHook{dead})
	defer rdb.Close()
	c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)), remutex.WithErrorHandler(func(error) {}))
	defer c.Close()
	once := c.NewOnce("migrate:"+p.version, remutex.WithLease(p.cfg.lease), remutex.WithFencing())
	err := once.Do(ctx, func(ctx context.Context) error {
		p.mu.Lock()
		p.r.runs++
		p.r.fences = append(p.r.fences, once.Fence())
		p.mu.Unlock()
		dies := p.kill >= 0 && p.killed.CompareAndSwap(false, true)
		done, replayed, err := migrate(ctx, p.db, p.dbKey, p.cfg, once.Fence(), dies, p.kill)
		p.mu.Lock()
		p.r.replayed += replayed
		if !dies && err == nil && done {
			p.r.completed++
		}
		p.mu.Unlock()
		if dies {
			dead.Store(true) // the process is gone: no more work, no more commands
			<-ctx.Done()     // (its hold ends with the lease, unrenewed)
			return fmt.Errorf("server %d died", i)
		}
		return err
	})
	switch {
	case dead.Load():
		return nil // a dead server serves nothing
	case err != nil:
		return err
	}
	// Serve: the migration must be complete.
	n, err := p.db.HLen(ctx, p.dbKey).Result()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || int(n) != p.cfg.steps {
		p.r.early++
		return nil
	}
	p.r.served++
	p.r.took = max(p.r.took, time.Since(p.start))
	return nil
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// migrate applies the steps after the last one recorded in the database
// (the hash at key: step → fence), each once, stopping after step kill if
// dies. It reports whether the migration is complete, and the steps it
// found applied already when it meant to apply them (0 if it resumed right).
func migrate(ctx context.Context, db *redis.Client, key string, cfg config, fence int64, dies bool, kill int) (done bool, replayed int, err error) {
	applied, err := db.HLen(ctx, key).Result()
	if err != nil {
		return false, 0, err
	}
	for s := int(applied) + 1; s <= cfg.steps; s++ {
		if dies && s > kill {
			return false, replayed, nil
		}
		select {
		case <-time.After(cfg.step):
		case <-ctx.Done():
			return false, replayed, context.Cause(ctx)
		}
		fresh, err := db.HSetNX(ctx, key, strconv.Itoa(s), fence).Result()
		if err != nil {
			return false, replayed, err
		}
		if !fresh {
			replayed++
		}
	}
	return true, replayed, nil
}

// deadHook fails every command once dead is set: the process it belongs
// to is gone.
type deadHook struct{ dead *atomic.Bool }

var errDead = errors.New("the process is dead")

func (h deadHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h deadHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.dead.Load() {
			cmd.SetErr(errDead)
			return errDead
		}
		return next(ctx, cmd)
	}
}

func (h deadHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.dead.Load() {
			for _, c := range cmds {
				c.SetErr(errDead)
			}
			return errDead
		}
		return next(ctx, cmds)
	}
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
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
