// Command flashsale sells a small stock to many concurrent buyers, once
// without a lock and once with a remutex.DistMutex, and compares the results.
//
// The stock is a plain Redis string that buyers read, think about for a moment
// (-gap) and write back decremented: the read-modify-write that oversells as
// soon as two buyers interleave. Each of the -clients remutex Clients has its
// own connection pool and stands for one process; -goroutines buyers run in
// each. Without the lock more items are sold than exist; with it exactly the
// stock is sold and it never goes below zero.
//
// With -procs N each sale runs in N operating-system processes instead: the
// program starts itself N times, each process one remutex Client with
// -goroutines buyers, and adds up what they report. The processes need a
// shared Redis: without REDIS_ADDR the embedded miniredis runs in the parent
// and the children connect to it.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/flashsale
//	go run ./examples/flashsale -procs 3
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/flashsale -stock 500 -buyers 2000
//
// It exits with status 1 if the locked run sold anything but the exact stock.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one sale.
type config struct {
	stock      int           // items for sale
	buyers     int           // buyers, each wanting one item
	clients    int           // remutex Clients, each with its own pool: processes
	goroutines int           // concurrent buyers per Client
	gap        time.Duration // between reading the stock and writing it back
	procs      int           // > 0: run each sale in this many processes, one Client each
}

// result is the outcome of one run.
type result struct {
	sold    int           // buyers told they got an item
	refused int           // buyers told it was sold out
	left    int           // the stock in Redis afterwards
	elapsed time.Duration // wall time of the run
}

// exact reports whether the run sold precisely the stock and left none.
func (r result) exact(cfg config) bool {
	return r.sold == cfg.stock && r.left == 0 && r.refused == cfg.buyers-cfg.stock
}

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec)) // a child started by -procs
	}
	var cfg config
	flag.IntVar(&cfg.stock, "stock", 100, "items for sale")
	flag.IntVar(&cfg.buyers, "buyers", 0, "buyers, each wanting one item (0: twice the stock)")
	flag.IntVar(&cfg.clients, "clients", 4, "remutex Clients, each with its own connection pool (processes)")
	flag.IntVar(&cfg.goroutines, "goroutines", 8, "concurrent buyers per Client")
	flag.DurationVar(&cfg.gap, "gap", time.Millisecond, "pause between reading the stock and writing it back")
	flag.IntVar(&cfg.procs, "procs", 0, "run each sale in N processes, each one Client with -goroutines buyers (0: -clients Clients in this process)")
	flag.Parse()
	if cfg.buyers == 0 {
		cfg.buyers = 2 * cfg.stock
	}
	if cfg.stock < 1 || cfg.buyers <= cfg.stock || cfg.clients < 1 || cfg.goroutines < 1 || cfg.gap < 0 || cfg.procs < 0 {
		fmt.Fprintln(os.Stderr, "flashsale: need -stock ≥ 1, -buyers > -stock, -clients ≥ 1, -goroutines ≥ 1, -gap ≥ 0, -procs ≥ 0")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ok, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "flashsale:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// run holds the sale twice, without and with the lock, on the Redis at addr
// (an embedded miniredis if addr is empty), prints the report to out, and
// reports whether the locked run was exact.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (bool, error) {
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return false, err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	if cfg.procs > 0 {
		fmt.Fprintf(out, "flash sale: %d items, %d buyers in %d processes × %d goroutines, %v between read and write\n",
			cfg.stock, cfg.buyers, cfg.procs, cfg.goroutines, cfg.gap)
	} else {
		fmt.Fprintf(out, "flash sale: %d items, %d buyers on %d clients × %d goroutines, %v between read and write\n",
			cfg.stock, cfg.buyers, cfg.clients, cfg.goroutines, cfg.gap)
	}
	fmt.Fprintf(out, "redis:      %s\n", where)

	unlocked, err := sale(ctx, addr, cfg, false)
	if err != nil {
		return false, fmt.Errorf("run without lock: %w", err)
	}
	fmt.Fprintf(out, "no lock:    %s\n", describe(cfg, unlocked))

	locked, err := sale(ctx, addr, cfg, true)
	if err != nil {
		return false, fmt.Errorf("run with DistMutex: %w", err)
	}
	fmt.Fprintf(out, "DistMutex:  %s\n", describe(cfg, locked))

	ok := locked.exact(cfg)
	switch {
	case !ok:
		fmt.Fprintf(out, "verdict:    FAIL: with the lock the sale should sell exactly %d items and leave 0\n", cfg.stock)
	case unlocked.exact(cfg):
		fmt.Fprintln(out, "verdict:    ok: the locked sale is exact (the unlocked one got lucky this time; try a larger -gap)")
	default:
		fmt.Fprintf(out, "verdict:    ok: the lock sold exactly %d; without it the stock was oversold\n", cfg.stock)
	}
	return ok, nil
}

// describe renders one result on a line.
func describe(cfg config, r result) string {
	s := fmt.Sprintf("sold %d, refused %d, stock left %d (%v)", r.sold, r.refused, r.left, r.elapsed.Round(time.Millisecond))
	if over := r.sold - cfg.stock; over > 0 {
		s += fmt.Sprintf(" — oversold by %d", over)
	}
	if lost := r.sold + r.left - cfg.stock; lost > 0 {
		s += fmt.Sprintf(", %d sales lost from the stock count", lost)
	}
	if r.left < 0 {
		s += ", stock negative"
	}
	return s
}

// sale runs one sale on fresh keys and removes its stock key afterwards.
func sale(ctx context.Context, addr string, cfg config, locked bool) (result, error) {
	if cfg.procs > 0 {
		return saleInProcs(ctx, addr, cfg, locked)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	run := newRunName()
	stockKey := run + ":stock"
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Set(ctx, stockKey, cfg.stock, time.Hour).Err(); err != nil {
		return result{}, err
	}
	defer admin.Del(context.WithoutCancel(ctx), stockKey)

	// One pool and one remutex Client per simulated process. The Clients are
	// closed before their pools (deferred calls run last-in first-out). In the
	// unlocked run the mutexes stay nil.
	rdbs := make([]*redis.Client, cfg.clients)
	mutexes := make([]*remutex.DistMutex, cfg.clients)
	for i := range rdbs {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer rdbs[i].Close()
		if locked {
			c := remutex.NewClient(rdbs[i])
			defer c.Close()
			mutexes[i] = c.NewMutex(run)
		}
	}

	var next atomic.Int64 // buyers that came
	come := func() (bool, error) { return next.Add(1) <= int64(cfg.buyers), nil }
	c := &counter{cancel: cancel}
	start := time.Now()
	for i := range cfg.clients {
		for range cfg.goroutines {
			c.start(func() { c.serve(ctx, come, rdbs[i], mutexes[i], stockKey, cfg.gap) })
		}
	}
	c.wg.Wait()
	elapsed := time.Since(start)
	if c.err != nil {
		return result{}, c.err
	}
	left, err := admin.Get(ctx, stockKey).Int()
	if err != nil {
		return result{}, err
	}
	return result{sold: int(c.sold.Load()), refused: int(c.refused.Load()), left: left, elapsed: elapsed}, nil
}

// newRunName returns a name for the keys and the lock of one sale.
func newRunName() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return "flashsale:" + hex.EncodeToString(id[:])
}

// counter is the buyer goroutines of one process, and what they sold.
type counter struct {
	sold, refused atomic.Int64
	cancel        context.CancelFunc // stops the others after a failure
	wg            sync.WaitGroup
	errOnce       sync.Once
	err           error // the first failure
}

// start runs f in a goroutine of the counter.
func (c *counter) start(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// serve serves buyers for as long as come reports that another one came.
func (c *counter) serve(ctx context.Context, come func() (bool, error), rdb *redis.Client, m *remutex.DistMutex, key string, gap time.Duration) {
	for {
		more, err := come()
		if err != nil {
			c.fail(err)
			return
		}
		if !more {
			return
		}
		got, err := buy(ctx, rdb, m, key, gap)
		if err != nil {
			c.fail(err)
			return
		}
		if got {
			c.sold.Add(1)
		} else {
			c.refused.Add(1)
		}
	}
}

// fail records the first failure and stops the others.
func (c *counter) fail(err error) {
	c.errOnce.Do(func() { c.err = err; c.cancel() })
}

// buy is one buyer: read the stock, and if any is left, take one and write the
// stock back. With m non-nil, it does so holding m.
func buy(ctx context.Context, rdb *redis.Client, m *remutex.DistMutex, key string, gap time.Duration) (got bool, err error) {
	if m != nil {
		if err := m.LockContext(ctx); err != nil {
			return false, err
		}
		defer func() {
			// ErrLockLost here would mean the stock may have been written by
			// two holders: the result is not to be trusted.
			if uerr := m.UnlockContext(context.WithoutCancel(ctx)); uerr != nil && err == nil {
				err = uerr
			}
		}()
	}
	s, err := rdb.Get(ctx, key).Result()
	if err != nil {
		return false, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return false, err
	}
	if n <= 0 {
		return false, nil
	}
	time.Sleep(gap) // payment, an inventory check, a slow network: the race window
	if err := rdb.Set(ctx, key, n-1, time.Hour).Err(); err != nil {
		return false, err
	}
	return true, nil
}

// workerEnv names the variable that makes the program a child of -procs; it
// holds the child's job as JSON.
const workerEnv = "FLASHSALE_WORKER"

// job is what one child process does: serve buyers from a counter shared by
// all children until -buyers have come.
type job struct {
	StockKey   string        `json:"stock_key"`
	NextKey    string        `json:"next_key"`  // INCR'd once per buyer
	ReadyKey   string        `json:"ready_key"` // the child pushes here when ready
	StartKey   string        `json:"start_key"` // and waits for a token here
	Lock       string        `json:"lock"`      // the lock's name; "" sells without it
	Buyers     int           `json:"buyers"`
	Goroutines int           `json:"goroutines"`
	Gap        time.Duration `json:"gap"`
}

// report is what a child prints on stdout when done.
type report struct {
	Sold    int           `json:"sold"`
	Refused int           `json:"refused"`
	Elapsed time.Duration `json:"elapsed"` // from the start to its last buyer
}

// saleInProcs runs one sale in cfg.procs child processes, each one remutex
// Client with its own pool, all on the Redis at addr, and adds up their
// reports.
func saleInProcs(ctx context.Context, addr string, cfg config, locked bool) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	run := newRunName()
	j := job{
		StockKey: run + ":stock", NextKey: run + ":next", ReadyKey: run + ":ready", StartKey: run + ":start",
		Buyers: cfg.buyers, Goroutines: cfg.goroutines, Gap: cfg.gap,
	}
	if locked {
		j.Lock = run
	}
	spec, err := json.Marshal(j)
	if err != nil {
		return result{}, err
	}
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Set(ctx, j.StockKey, cfg.stock, time.Hour).Err(); err != nil {
		return result{}, err
	}
	defer admin.Del(context.WithoutCancel(ctx), j.StockKey, j.NextKey, j.ReadyKey, j.StartKey)

	children := make([]*child, 0, cfg.procs)
	defer func() {
		cancel() // kills the children still running after a failure
		for _, ch := range children {
			<-ch.exited
		}
	}()
	for range cfg.procs {
		ch, err := startChild(ctx, exe, string(spec), addr)
		if err != nil {
			return result{}, err
		}
		children = append(children, ch)
	}
	if err := startLine(ctx, admin, j, children); err != nil {
		return result{}, err
	}
	r, err := addUp(children)
	if err != nil {
		return result{}, err
	}
	if r.left, err = admin.Get(ctx, j.StockKey).Int(); err != nil {
		return result{}, err
	}
	return r, nil
}

// child is one process of a sale.
type child struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	err            error         // from Wait
	exited         chan struct{} // closed once err is set
}

// startChild starts this program again as a child with the job spec, on the
// Redis at addr; it is killed when ctx ends.
func startChild(ctx context.Context, exe, spec, addr string) (*child, error) {
	ch := &child{exited: make(chan struct{})}
	ch.cmd = exec.CommandContext(ctx, exe)
	ch.cmd.Env = append(os.Environ(), workerEnv+"="+spec, "REDIS_ADDR="+addr)
	ch.cmd.Stdout, ch.cmd.Stderr = &ch.stdout, &ch.stderr
	if err := ch.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { ch.err = ch.cmd.Wait(); close(ch.exited) }()
	return ch, nil
}

// startLine waits until every child has connected and said it is ready, then
// lets all go at once, so that the processes compete from the first buyer.
func startLine(ctx context.Context, admin *redis.Client, j job, children []*child) error {
	for ready := 0; ready < len(children); {
		err := admin.BLPop(ctx, time.Second, j.ReadyKey).Err()
		switch {
		case err == nil:
			ready++
			continue
		case !errors.Is(err, redis.Nil):
			return fmt.Errorf("waiting for the processes to start: %w", err)
		}
		for i, ch := range children {
			select {
			case <-ch.exited:
				return fmt.Errorf("process %d ended before the start: %v: %s", i+1, ch.err, strings.TrimSpace(ch.stderr.String()))
			default:
			}
		}
	}
	tokens := make([]interface{}, len(children))
	for i := range tokens {
		tokens[i] = "go"
	}
	return admin.RPush(ctx, j.StartKey, tokens...).Err()
}

// addUp waits for the children and adds up their reports.
func addUp(children []*child) (result, error) {
	var r result
	var errs []error
	for i, ch := range children {
		<-ch.exited
		if ch.err != nil {
			errs = append(errs, fmt.Errorf("process %d: %v: %s", i+1, ch.err, strings.TrimSpace(ch.stderr.String())))
			continue
		}
		var rep report
		if err := json.Unmarshal(ch.stdout.Bytes(), &rep); err != nil {
			errs = append(errs, fmt.Errorf("process %d: report %q: %v", i+1, ch.stdout.String(), err))
			continue
		}
		r.sold += rep.Sold
		r.refused += rep.Refused
		// The children's own times, not the time until they exited: that
		// includes process teardown (a second under the race detector).
		r.elapsed = max(r.elapsed, rep.Elapsed)
	}
	return r, errors.Join(errs...)
}

// workerMain is a child process of -procs: one remutex Client (if the job
// is locked) on one pool, with job.Goroutines buyers. It returns the exit
// status.
func workerMain(spec string) int {
	var j job
	if err := json.Unmarshal([]byte(spec), &j); err != nil {
		fmt.Fprintln(os.Stderr, "flashsale worker:", err)
		return 2
	}
	rep, err := work(context.Background(), os.Getenv("REDIS_ADDR"), j)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flashsale worker:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "flashsale worker:", err)
		return 1
	}
	return 0
}

// work is the job of a child: it says it is ready, waits for the start, and
// serves buyers until the job's number of them have come, across all
// processes.
func work(ctx context.Context, addr string, j job) (report, error) {
	if addr == "" {
		return report{}, errors.New("REDIS_ADDR not set")
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var m *remutex.DistMutex
	if j.Lock != "" {
		c := remutex.NewClient(rdb)
		defer c.Close() // before rdb.Close
		m = c.NewMutex(j.Lock)
	}
	if err := rdb.RPush(ctx, j.ReadyKey, "ready").Err(); err != nil {
		return report{}, err
	}
	if err := rdb.BLPop(ctx, 0, j.StartKey).Err(); err != nil {
		return report{}, fmt.Errorf("waiting for the start: %w", err)
	}
	start := time.Now()

	come := func() (bool, error) { // the next buyer, across all processes
		n, err := rdb.Incr(ctx, j.NextKey).Result()
		return n <= int64(j.Buyers), err
	}
	c := &counter{cancel: cancel}
	for range j.Goroutines {
		c.start(func() { c.serve(ctx, come, rdb, m, j.StockKey, j.Gap) })
	}
	c.wg.Wait()
	if c.err != nil {
		return report{}, c.err
	}
	return report{Sold: int(c.sold.Load()), Refused: int(c.refused.Load()), Elapsed: time.Since(start)}, nil
}
