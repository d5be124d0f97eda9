// Command semaphore shows a remutex.DistSemaphore keeping several processes
// within an API's limit on concurrent calls.
//
// The API (an HTTP server in this program) allows -limit calls at once: a
// call that arrives while -limit others are in progress is refused with 429
// Too Many Requests, as rate-limited APIs do. -procs processes, each a
// remutex Client with its own connection pool and -workers goroutines, make
// -calls calls between them. Every process alone keeps below the limit
// easily; together they do not. The calls run once without a limit and once
// with a DistSemaphore of -limit permits, shared by every process: each
// call runs inside Do(ctx, 1, ...), which acquires a permit, calls, and
// releases it. With it the API never sees more than -limit calls at once and
// every call succeeds; waiting workers queue for permits first in, first out
// across the processes.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/semaphore
//	go run ./examples/semaphore -limit 2 -procs 4 -workers 16
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/semaphore
//
// It exits with status 1 if, with the semaphore, the API saw more than
// -limit calls at once or refused any.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run of the example.
type config struct {
	procs   int           // processes calling the API, one Client each
	workers int           // goroutines per process
	calls   int           // calls made by all of them together
	limit   int           // the API's concurrent calls, and the semaphore's size
	latency time.Duration // how long the API takes to answer a call
}

func main() {
	var cfg config
	flag.IntVar(&cfg.procs, "procs", 3, "processes calling the API, each with its own remutex Client")
	flag.IntVar(&cfg.workers, "workers", 8, "goroutines calling the API in each process")
	flag.IntVar(&cfg.calls, "calls", 120, "calls made by all processes together")
	flag.IntVar(&cfg.limit, "limit", 4, "calls the API allows at once: the semaphore's size")
	flag.DurationVar(&cfg.latency, "latency", 5*time.Millisecond, "how long the API takes to answer a call")
	flag.Parse()
	if cfg.procs < 1 || cfg.workers < 1 || cfg.calls < 1 || cfg.limit < 1 || cfg.latency < 0 {
		fmt.Fprintln(os.Stderr, "semaphore: need -procs, -workers, -calls, -limit ≥ 1 and -latency ≥ 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	limited, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "semaphore:", err)
		os.Exit(1)
	}
	if !limited.ok(cfg) {
		os.Exit(1)
	}
}

// outcome is what the API saw in one run.
type outcome struct {
	served  int           // calls done (answered 200)
	refused int           // answers 429, each retried
	peak    int64         // calls in progress at once, at most
	perProc []int         // calls done per process
	took    time.Duration // wall time of the run
}

// ok reports a run within the limit: every call served, never more than the
// limit at once.
func (o outcome) ok(cfg config) bool {
	return o.served == cfg.calls && o.refused == 0 && o.peak <= int64(cfg.limit)
}

func (o outcome) String() string {
	return fmt.Sprintf("%d calls done, %d answered 429 and retried; the API saw up to %d at once (%v)",
		o.served, o.refused, o.peak, o.took.Round(time.Millisecond))
}

// run makes the calls twice, without and with the semaphore, on the Redis at
// addr (an embedded miniredis if addr is empty), prints what the API saw to
// out, and returns the outcome with the semaphore.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (outcome, error) {
	where := "Redis at " + addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return outcome{}, err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "semaphore:      %d processes (one Client each) × %d workers make %d calls to an API that allows %d at once (a call takes %v)\n",
		cfg.procs, cfg.workers, cfg.calls, cfg.limit, cfg.latency)
	fmt.Fprintf(out, "redis:          %s\n", where)
	free, err := calls(ctx, cfg, addr, false)
	if err != nil {
		return outcome{}, fmt.Errorf("run without the semaphore: %w", err)
	}
	fmt.Fprintf(out, "no semaphore:   %v\n", free)
	limited, err := calls(ctx, cfg, addr, true)
	if err != nil {
		return outcome{}, fmt.Errorf("run with the semaphore: %w", err)
	}
	fmt.Fprintf(out, "DistSemaphore:  %v; calls by process: %s\n", limited, strings.Trim(fmt.Sprint(limited.perProc), "[]"))
	fmt.Fprintf(out, "verdict:        %s\n", verdict(cfg, free, limited))
	return limited, nil
}

// verdict is the report's last line: ok, or FAIL if with the semaphore the
// API saw more than the limit at once or refused a call.
func verdict(cfg config, free, limited outcome) string {
	switch {
	case !limited.ok(cfg):
		return fmt.Sprintf("FAIL: with DistSemaphore(%d) the API should see at most %d calls at once and refuse none", cfg.limit, cfg.limit)
	case free.peak <= int64(cfg.limit):
		return fmt.Sprintf("ok: with the semaphore the API refused no call (this time it saw no more than %d at once without it either; try more -workers)", cfg.limit)
	}
	return fmt.Sprintf("ok: with DistSemaphore(%d) the API never saw more than %d calls at once and refused none; without it up to %d, %d refused",
		cfg.limit, cfg.limit, free.peak, free.refused)
}

// api is the rate-limited API: it refuses a call that arrives while limit
// others are in progress.
type api struct {
	limit            int64
	latency          time.Duration
	inProgress, peak atomic.Int64
}

func (a *api) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := a.inProgress.Add(1)
	defer a.inProgress.Add(-1)
	for p := a.peak.Load(); n > p && !a.peak.CompareAndSwap(p, n); p = a.peak.Load() {
	}
	if n > a.limit {
		http.Error(w, "too many concurrent calls", http.StatusTooManyRequests)
		return
	}
	time.Sleep(a.latency)
	fmt.Fprintln(w, "ok")
}

// pass is one run of the calls: the API, and what the workers did.
type pass struct {
	cfg             config
	api             *api
	url             string
	next            atomic.Int64 // calls started
	served, refused atomic.Int64
	perProc         []atomic.Int64
	cancel          context.CancelFunc // stops the others after a failure
	errOnce         sync.Once
	err             error // the first failure
}

// calls runs one pass: every process's workers make calls until cfg.calls
// have been made, each call inside a permit of the semaphore if limited.
func calls(ctx context.Context, cfg config, addr string, limited bool) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ps := &pass{cfg: cfg, api: &api{limit: int64(cfg.limit), latency: cfg.latency}, perProc: make([]atomic.Int64, cfg.procs), cancel: cancel}
	srv := httptest.NewServer(ps.api)
	defer srv.Close()
	ps.url = srv.URL
	name := newName()
	if limited {
		// A semaphore keeps its size in Redis without expiry (see
		// DistSemaphore); this one's name is used once.
		admin := redis.NewClient(&redis.Options{Addr: addr})
		defer admin.Close()
		defer admin.Del(context.WithoutCancel(ctx), "remutex:{"+name+"}:sem:size")
	}
	var wg sync.WaitGroup
	start := time.Now()
	for p := range cfg.procs {
		// One process: its own connection pool and Client, one semaphore
		// value that its workers share (permits are the value's, not a
		// goroutine's, as with x/sync's semaphore), its own HTTP client.
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		var sem *remutex.DistSemaphore
		if limited {
			c := remutex.NewClient(rdb)
			defer c.Close() // before rdb.Close
			sem = c.NewSemaphore(name, int64(cfg.limit))
		}
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.workers}}
		defer hc.CloseIdleConnections()
		for range cfg.workers {
			wg.Go(func() { ps.work(ctx, p, hc, sem) })
		}
	}
	wg.Wait()
	o := outcome{served: int(ps.served.Load()), refused: int(ps.refused.Load()), peak: ps.api.peak.Load(), took: time.Since(start)}
	for i := range ps.perProc {
		o.perProc = append(o.perProc, int(ps.perProc[i].Load()))
	}
	return o, ps.err
}

// work is a worker of process p: it makes calls until cfg.calls have been
// started, each inside a permit of sem unless sem is nil.
func (ps *pass) work(ctx context.Context, p int, hc *http.Client, sem *remutex.DistSemaphore) {
	for ps.next.Add(1) <= int64(ps.cfg.calls) {
		var err error
		if sem != nil {
			// Do acquires a permit, calls, and releases the permit when
			// the call returns; ctx ends if the permit is lost meanwhile.
			err = sem.Do(ctx, 1, func(ctx context.Context, _ int64) error { return ps.call(ctx, hc) })
		} else {
			err = ps.call(ctx, hc)
		}
		if err != nil {
			ps.errOnce.Do(func() { ps.err = err; ps.cancel() })
			return
		}
		ps.served.Add(1)
		ps.perProc[p].Add(1)
	}
}

// call calls the API until it answers 200: after a 429 it tries again a
// little later, as the clients of such APIs do.
func (ps *pass) call(ctx context.Context, hc *http.Client) error {
	for {
		ok, err := get(ctx, hc, ps.url)
		if err != nil || ok {
			return err
		}
		ps.refused.Add(1)
		time.Sleep(ps.cfg.latency)
	}
}

// get calls the API once: true if it answered 200, false if 429.
func get(ctx context.Context, hc *http.Client, url string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("the API answered %s", resp.Status)
}

// newName returns a name for the semaphore of one pass: Redis keeps a
// semaphore's size, and a run with another -limit needs a name of its own.
func newName() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return "examples:semaphore:" + hex.EncodeToString(id[:])
}
