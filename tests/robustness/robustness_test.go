package robustness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/lockcheck"
	"github.com/remutex/remutex/internal/redistest"
)

// The robustness test, in the manner of etcd's tests/robustness: random
// traffic (traffic_test.go) from several Clients, each through a proxy of
// its own to one real redis-server, under random faults
// (failpoints_test.go), recording a history (internal/lockcheck) that is
// checked afterwards (validate_test.go). Every choice comes from one seed,
// which the test prints: the same seed makes the same choices (the timing,
// and so the interleaving, differs from run to run). It uses remutex's
// public API only; the request faults know the scripts' SHA1s from
// internal/scripts.
//
//	go test -run 'TestRobustness$' -count=1 ./tests/robustness             # 30s
//	go test -run 'TestRobustness$' -count=1 -timeout 0 ./tests/robustness -robust.duration=10m
//	REMUTEX_ROBUST_DURATION=10m go test -run 'TestRobustness$' -count=1 -timeout 0 ./tests/robustness
//	go test -run 'TestRobustness$' -count=1 ./tests/robustness -robust.seed=N  # replay N
//
// It runs on a real redis-server only: miniredis does not expire keys by
// the clock, so leases, the heart of what is tested, would never end.

var (
	robustSeedFlag     = flag.Uint64("robust.seed", 0, "seed of TestRobustness (0: a random one, printed)")
	robustDurationFlag = flag.Duration("robust.duration", 0, "traffic time of TestRobustness (default 30s, or $"+robustDurationEnv+")")
	robustGraceFlag    = flag.Duration("robust.grace", 20*time.Millisecond, "overlaps up to this long are near misses, not violations (the recorder's own latency)")
)

// robustDurationEnv sets the traffic time of TestRobustness when the flag
// does not: a long run.
const robustDurationEnv = "REMUTEX_ROBUST_DURATION"

func robustDuration(t *testing.T) time.Duration {
	if *robustDurationFlag > 0 {
		return *robustDurationFlag
	}
	if s := os.Getenv(robustDurationEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", robustDurationEnv, s)
		}
		return d
	}
	return 30 * time.Second
}

// robustConfig is what the seed chose for a run's locks.
type robustConfig struct {
	leaseA, leaseB, leaseMH, leaseNR, leaseRW, leaseSem time.Duration
	minHold                                             time.Duration
	semSize                                             int64
	clients, workers                                    int
}

func (c robustConfig) String() string {
	return fmt.Sprintf("%d Clients x %d workers; mutex m: leases %v and %v; mutex mh: lease %v, min hold %v; "+
		"mutex nr (NonReentrant): lease %v; rwmutex rw: lease %v; semaphore sem: %d permits, lease %v",
		c.clients, c.workers, c.leaseA, c.leaseB, c.leaseMH, c.minHold, c.leaseNR, c.leaseRW, c.semSize, c.leaseSem)
}

// robustEnv is one run: the server, the links, the Clients, the history.
type robustEnv struct {
	t          testing.TB
	seed       uint64
	cfg        robustConfig
	lease      time.Duration // the reference lease: fault and work times
	grace      time.Duration
	hist       *lockcheck.History
	server     *robustServer
	links      []*robustLink
	clients    []*robustClient
	oracle     *remutex.Client // fault-free, straight to the server
	failpoints []robustFailpoint
	// By the nemesis only, read after it is joined: faults injected by
	// kind; of the kinds that take requests or replies, how many took
	// some; and the calls they took, by kind of call.
	faults, fired, hits map[string]int
	callRounds          map[string][]robustCall // by the nemesis: the calls each request fault takes next
	stop                <-chan struct{}         // closed when the traffic stops
	stopAt, freeAt      time.Duration           // when the traffic stopped, when every lock was free again
	slow                []string                // the calls still under way 2s after the faults were healed
	stats               robustStats
}

// newRobustEnv starts a redis-server and the Clients of a run of seed.
func newRobustEnv(t testing.TB, seed uint64, clients, workers int) *robustEnv {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 0))
	env := &robustEnv{t: t, seed: seed, grace: *robustGraceFlag, hist: lockcheck.New(),
		failpoints: robustFailpoints, faults: map[string]int{}, fired: map[string]int{}, hits: map[string]int{},
		callRounds: map[string][]robustCall{}, stats: robustStats{n: map[string]int{}}}
	// Leases from 200ms to 2s, around a reference lease of 300ms to 1s.
	env.lease = 300*time.Millisecond + time.Duration(r.Int64N(int64(700*time.Millisecond)))
	lease := func() time.Duration {
		d := time.Duration(float64(env.lease) * (0.5 + 1.5*r.Float64()))
		return min(max(d, 200*time.Millisecond), 2*time.Second).Round(time.Millisecond)
	}
	env.cfg = robustConfig{leaseA: lease(), leaseB: lease(), leaseMH: lease(), leaseNR: lease(), leaseRW: lease(),
		leaseSem: lease(), semSize: 2 + r.Int64N(2), clients: clients, workers: workers}
	env.cfg.minHold = (env.cfg.leaseMH/4 + time.Duration(r.Int64N(int64(env.cfg.leaseMH*7/4)))).Round(time.Millisecond)

	bin := redistest.Require(t, "redis-server")
	srv, err := redistest.Launch(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	env.server = &robustServer{bin: bin, dir: srv.Dir(), port: srv.Port(), srv: srv}
	t.Cleanup(env.server.stop)

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// go-redis's own complaints (dials refused while Redis restarts) go to
	// the history instead of the test's output.
	redis.SetLogger(robustRedisLog{env.hist})
	t.Cleanup(func() { redis.SetLogger(stderrRedisLog{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}) })
	direct := redis.NewClient(&redis.Options{Addr: env.server.addr()})
	t.Cleanup(func() { _ = direct.Close() })
	env.oracle = remutex.NewClient(direct, remutex.WithLogger(quiet))
	t.Cleanup(func() { _ = env.oracle.Close() })
	for i := 1; i <= clients; i++ {
		env.clients = append(env.clients, env.newClient(i, r, quiet))
	}
	return env
}

type robustRedisLog struct{ h *lockcheck.History }

func (l robustRedisLog) Printf(_ context.Context, format string, v ...any) {
	l.h.Log("go-redis", format, v...)
}

type stderrRedisLog struct{ l *log.Logger }

func (l stderrRedisLog) Printf(_ context.Context, format string, v ...any) {
	_ = l.l.Output(2, fmt.Sprintf(format, v...))
}

// newClient makes Client i with its link, go-redis options chosen by
// r, and the lock values its workers share.
func (env *robustEnv) newClient(i int, r *rand.Rand, quiet *slog.Logger) *robustClient {
	t := env.t
	link := newRobustLink(env, env.server.addr())
	env.links = append(env.links, link)
	opt := &redis.Options{Addr: link.addr()}
	var opts []string
	switch r.IntN(3) {
	case 1:
		opt.ReadTimeout = 100 * time.Millisecond
	case 2:
		opt.ReadTimeout = 400 * time.Millisecond
	}
	if opt.ReadTimeout > 0 {
		opts = append(opts, "ReadTimeout "+opt.ReadTimeout.String())
	}
	if r.IntN(2) == 0 {
		opt.MaxRetries = -1
		opts = append(opts, "MaxRetries -1")
	}
	if r.IntN(2) == 0 {
		// Unlock's calls then go on their callers' goroutines.
		opt.ContextTimeoutEnabled = true
		opts = append(opts, "ContextTimeoutEnabled")
	}
	link.readTimeout = opt.ReadTimeout
	if link.readTimeout == 0 {
		link.readTimeout = 3 * time.Second // go-redis's default
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	cl := &robustClient{idx: i}
	who := fmt.Sprintf("c%d", i)
	cl.c = remutex.NewClient(rdb, remutex.WithLogger(quiet), remutex.WithErrorHandler(func(err error) {
		cl.errs.Add(1)
		at := env.hist.Log(who, "error handler: %v", err)
		cl.heard(at, err)
	}))
	t.Cleanup(func() { _ = cl.c.Close() })
	cfg := env.cfg
	lease, fencing := remutex.WithLease, remutex.WithFencing()
	cl.m[0] = mutexLocker("mutex m", "m.A", cl.c.NewMutex("m", lease(cfg.leaseA), fencing), 0)
	cl.m[1] = mutexLocker("mutex m", "m.B", cl.c.NewMutex("m", lease(cfg.leaseB), fencing), 0)
	cl.mh = mutexLocker("mutex mh", "mh", cl.c.NewMutex("mh", lease(cfg.leaseMH), remutex.WithMinHold(cfg.minHold), fencing), cfg.minHold)
	cl.rw, cl.rr = rwLockers("rwmutex rw", cl.c.NewRWMutex("rw", lease(cfg.leaseRW), fencing))
	env.hist.Log("setup", "c%d: go-redis options %v", i, opts)
	t.Logf("c%d: go-redis options %v", i, opts)
	return cl
}

// robustStats counts calls by form and outcome.
type robustStats struct {
	mu sync.Mutex
	n  map[string]int
}

// count adds a call's outcome to the statistics.
func (env *robustEnv) count(call string, err error) {
	form := call
	if i := strings.IndexByte(call, '('); i >= 0 {
		form = call[:i]
	}
	var p *robustPanic
	switch {
	case err == nil:
		form += " ok"
	case errors.Is(err, errRefused):
		form += " not taken"
	case errors.As(err, &p):
		form += " panic"
	case errors.Is(err, remutex.ErrLockLost):
		form += " ErrLockLost"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		form += " ctx done"
	default:
		form += " other error"
	}
	env.stats.mu.Lock()
	env.stats.n[form]++
	env.stats.mu.Unlock()
}

// run drives traffic and faults for d, heals, waits for the workers, and
// checks that every lock is free again. It returns the workers' end.
func (env *robustEnv) run(d time.Duration) time.Duration {
	stop := make(chan struct{})
	env.stop = stop
	nemesisDone := make(chan struct{})
	go env.nemesis(rand.New(rand.NewPCG(env.seed, 1)), stop, nemesisDone)
	var workers []*robustWorker
	var wg sync.WaitGroup
	for _, cl := range env.clients {
		for i := 1; i <= env.cfg.workers; i++ {
			w := newRobustWorker(env, cl, i, env.seed)
			workers = append(workers, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.run(stop)
			}()
		}
	}
	time.Sleep(d)
	env.stopAt = env.hist.Log("run", "traffic stops")
	close(stop)
	<-nemesisDone
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	patience := 5*env.cfg.maxLease() + env.cfg.minHold + 15*time.Second
	stuck := time.NewTimer(patience)
	defer stuck.Stop()
	slow := time.NewTimer(2 * time.Second) // what a slow end waits for, for the report
	defer slow.Stop()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-slow.C:
			for _, w := range workers {
				if s := w.doing.Load().(string); s != "" {
					env.slow = append(env.slow, w.who+": "+s)
					env.hist.Log("run", "%s still in %s", w.who, s)
				}
			}
		case <-stuck.C:
			for _, w := range workers {
				if s := w.doing.Load().(string); s != "" {
					env.hist.Violate("liveness", w.who, "stuck in %s, %v after the faults were healed", s, patience)
				}
			}
			return env.hist.Now()
		}
	}
	end := env.hist.Now()
	env.hist.Log("run", "every worker returned")
	env.checkFree()
	env.freeAt = env.hist.Now()
	return end
}

func (c robustConfig) maxLease() time.Duration {
	return max(c.leaseA, c.leaseB, c.leaseMH, c.leaseNR, c.leaseRW, c.leaseSem)
}

// checkFree waits until every lock is free on the server (nothing holds or
// waits), as it must be within a lease once every hold was released.
func (env *robustEnv) checkFree() {
	bound := env.cfg.maxLease() + env.cfg.minHold + 5*time.Second
	deadline := time.Now().Add(bound)
	for _, name := range []string{"m", "mh", "nr", "rw", "sem"} {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := env.oracle.Inspect(ctx, name)
			cancel()
			if err == nil && len(info.Holders) == 0 && len(info.Waiters) == 0 {
				break
			}
			if time.Now().After(deadline) {
				env.hist.Violate("liveness", "run", "%s is not free %v after every holder released: %+v (err %v)", name, bound, info, err)
				break
			}
			time.Sleep(20 * time.Millisecond) // Redis state has no event to wait for
		}
	}
}

func TestRobustness(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: the robustness test runs seeded traffic under faults for its whole duration")
	}
	seed := *robustSeedFlag
	if seed == 0 {
		seed = rand.Uint64()
	}
	d := robustDuration(t)
	replay := fmt.Sprintf("go test -run 'TestRobustness$' -count=1 -timeout 0 ./tests/robustness -robust.seed=%d -robust.duration=%v", seed, d)
	t.Logf("seed %d; replay: %s", seed, replay)
	env := newRobustEnv(t, seed, 3, 3)
	t.Logf("%v; reference lease %v, grace %v", env.cfg, env.lease, env.grace)
	end := env.run(d)
	env.report(t, end, replay)
}

// report checks the history and reports what it found; on violations it
// writes the whole history to a file and prints each with its timeline.
func (env *robustEnv) report(t *testing.T, end time.Duration, replay string) {
	h := env.hist
	bad, near := env.check(end)
	var stats []string
	for k, n := range env.stats.n {
		stats = append(stats, fmt.Sprintf("%s: %d", k, n))
	}
	slices.Sort(stats)
	counts := h.Counts()
	var handled int64
	for _, cl := range env.clients {
		handled += cl.errs.Load()
	}
	t.Logf("%d holds (%d lost), %d restarts, faults %v, %d errors reported to the handlers; calls:\n\t%s",
		counts.Held, counts.Lost, counts.Restarts, env.faults, handled, strings.Join(stats, "\n\t"))
	t.Logf("traffic stopped at %v; every worker returned %v later, every lock was free %v later",
		lockcheck.At(env.stopAt), (end - env.stopAt).Round(time.Millisecond), (env.freeAt - end).Round(time.Millisecond))
	if len(env.slow) > 0 {
		t.Logf("calls still under way 2s after the faults were healed:\n\t%s", strings.Join(env.slow, "\n\t"))
	}
	t.Logf("request and one-way faults that took something: %v; lock calls they took: %v; kinds that did nothing: %v",
		env.fired, env.hits, env.unfired())
	if len(near) > 0 {
		t.Logf("%d near misses (within the grace of %v), the first: %v", len(near), env.grace, near[0])
	}
	if len(bad) == 0 {
		return
	}
	path := ""
	if f, err := os.CreateTemp("", fmt.Sprintf("remutex-robust-%d-*.log", env.seed)); err == nil {
		fmt.Fprintf(f, "seed %d\n%v\n", env.seed, env.cfg)
		for _, v := range bad {
			fmt.Fprintf(f, "VIOLATION %v\n", v)
		}
		_, _ = io.WriteString(f, h.Timeline(0, end+time.Hour, nil))
		_ = f.Close()
		path = f.Name()
	}
	for i, v := range bad {
		if i == 5 {
			t.Errorf("... and %d more violations", len(bad)-i)
			break
		}
		t.Errorf("violation %d of %d: %v\ntimeline of the holders and the nemesis:\n%s", i+1, len(bad), v, env.window(v))
	}
	kinds := map[string]int{}
	for _, v := range bad {
		kinds[v.Kind]++
	}
	t.Errorf("%d violations %v with seed %d; whole history: %s\nreplay: %s", len(bad), kinds, env.seed, path, replay)
}

// window is the timeline around v: its holders' calls and the faults, from
// a lease before the first of them began until a lease after v.
func (env *robustEnv) window(v lockcheck.Violation) string {
	from := v.At - 2*env.lease
	who := map[string]bool{"nemesis": true}
	for _, hd := range v.Holds {
		from = min(from, hd.Invoke-env.lease)
		who[hd.Who] = true
		who[hd.Client] = true
	}
	if len(v.Holds) == 0 {
		who = nil
	}
	return env.hist.Timeline(from, v.At+env.lease, who)
}
