package remutex

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Benchmarks run on REDIS_ADDR when it is set, else on the shared
// redis-server of the tests, else (no redis-server on PATH and
// REMUTEX_REQUIRE_REDIS unset) on miniredis, whose figures say little about a
// real deployment: it runs in this process, so its work shows in allocs/op
// and client CPU, and it has no INFO cpu. They measure and report; they fail only on a correctness
// violation (two holders at once, a TryLock that succeeds on a held lock).
//
// Custom metrics:
//
//	rtt/op       round trips to Redis per operation, counted by a go-redis hook
//	             (a pipeline counts once); pub/sub traffic is not included
//	p50-ms ...   wait from the Lock call to its return
//	util-%       time the lock was held by some worker over wall time; with
//	             cs=sleep it also rises when time.Sleep overshoots, so read
//	             it with held-ms (mean hold) and the hand-off figures
//	handoff-...  from a holder's Unlock call to the next holder's Lock return
//	spread       most over fewest acquisitions of one worker
//	cpu-us/acq   redis-server CPU (INFO cpu, user+sys) per acquisition

// benchAddr returns the address of the Redis to benchmark against.
func benchAddr(b *testing.B) string {
	b.Helper()
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	if _, err := exec.LookPath("redis-server"); err == nil || os.Getenv("REMUTEX_REQUIRE_REDIS") == "1" {
		return redistest.Shared(b).Addr()
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(mr.Close)
	b.Logf("redis-server not on PATH: running on miniredis")
	return mr.Addr()
}

// rttCounter is a go-redis hook that counts round trips: each command sent on
// its own and each pipeline count once. keys counts the keys of the script
// calls sent in pipelines (the watchdog's renewals).
type rttCounter struct {
	rtt  atomic.Int64
	keys atomic.Int64
}

func (h *rttCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *rttCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.rtt.Add(1)
		return next(ctx, cmd)
	}
}

func (h *rttCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.rtt.Add(1)
		for _, cmd := range cmds {
			if name := cmd.Name(); name != "evalsha" && name != "eval" {
				continue
			}
			if args := cmd.Args(); len(args) > 2 {
				if n, err := strconv.Atoi(fmt.Sprint(args[2])); err == nil {
					h.keys.Add(int64(n))
				}
			}
		}
		return next(ctx, cmds)
	}
}

func (h *rttCounter) reset() {
	h.rtt.Store(0)
	h.keys.Store(0)
}

// benchRDB returns a go-redis client with its own pool (one per simulated
// process), counting round trips in cnt when cnt is not nil.
func benchRDB(b *testing.B, addr string, cnt *rttCounter) *redis.Client {
	b.Helper()
	rdb := rdbAt(b, addr)
	if cnt != nil {
		rdb.AddHook(cnt)
	}
	return rdb
}

var benchSeq atomic.Int64

// benchName returns a lock name used by no other benchmark run.
func benchName(b *testing.B) string {
	return "bench." + strings.ReplaceAll(b.Name(), "/", ".") + "." +
		strconv.FormatInt(time.Now().UnixNano(), 36) + "." + strconv.FormatInt(benchSeq.Add(1), 10)
}

// BenchmarkLockUnlock is one uncontended Lock+Unlock cycle: one round trip to
// acquire, one to release. client-cpu-us/op is this process's CPU per cycle.
// ContextTimeout: the go-redis client has ContextTimeoutEnabled, so that
// Unlock's call goes on its caller's goroutine (see docs/performance.md).
func BenchmarkLockUnlock(b *testing.B) {
	benchLockUnlock(b, false)
}

func BenchmarkLockUnlockContextTimeout(b *testing.B) {
	benchLockUnlock(b, true)
}

func benchLockUnlock(b *testing.B, contextTimeout bool) {
	addr := benchAddr(b)
	var cnt rttCounter
	rdb := newRDB(b, &redis.Options{Addr: addr, ContextTimeoutEnabled: contextTimeout})
	rdb.AddHook(&cnt)
	c := clientOn(b, rdb)
	m := c.NewMutex(benchName(b))
	m.Lock() // load the scripts, open the connection
	m.Unlock()
	b.ReportAllocs()
	cnt.reset()
	cpu := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Lock()
		m.Unlock()
	}
	b.StopTimer()
	b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
	b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "client-cpu-us/op")
}

// BenchmarkRWMutex is a DistRWMutex's uncontended RLock+RUnlock and
// Lock+Unlock cycles, to set beside BenchmarkLockUnlock.
func BenchmarkRWMutex(b *testing.B) {
	for _, read := range []bool{true, false} {
		b.Run(map[bool]string{true: "RLock", false: "Lock"}[read], func(b *testing.B) {
			var cnt rttCounter
			c := clientOn(b, benchRDB(b, benchAddr(b), &cnt))
			rw := c.NewRWMutex(benchName(b))
			lock, unlock := rw.Lock, rw.Unlock
			if read {
				lock, unlock = rw.RLock, rw.RUnlock
			}
			lock() // load the scripts, open the connection
			unlock()
			b.ReportAllocs()
			cnt.reset()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				lock()
				unlock()
			}
			b.StopTimer()
			b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
		})
	}
}

// BenchmarkNested is Lock×depth then Unlock×depth on one goroutine. Only the
// outermost pair takes and frees the lock; rtt/nested is the cost of each
// nested Lock or Unlock alone.
func BenchmarkNested(b *testing.B) {
	for _, depth := range []int{3} {
		b.Run("depth="+strconv.Itoa(depth), func(b *testing.B) {
			addr := benchAddr(b)
			var cnt rttCounter
			c := clientOn(b, benchRDB(b, addr, &cnt))
			m := c.NewMutex(benchName(b))
			m.Lock()
			m.Unlock()
			b.ReportAllocs()
			cnt.reset()
			var nested int64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				m.Lock()
				before := cnt.rtt.Load()
				for j := 1; j < depth; j++ {
					m.Lock()
				}
				for j := 1; j < depth; j++ {
					m.Unlock()
				}
				nested += cnt.rtt.Load() - before
				m.Unlock()
			}
			b.StopTimer()
			b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
			if depth > 1 {
				b.ReportMetric(float64(nested)/float64(b.N*2*(depth-1)), "rtt/nested")
			}
		})
	}
}

// BenchmarkTryLockFail is TryLock on a lock another Client holds.
func BenchmarkTryLockFail(b *testing.B) {
	addr := benchAddr(b)
	name := benchName(b)
	holder := clientOn(b, benchRDB(b, addr, nil)).NewMutex(name)
	holder.Lock()
	defer holder.Unlock()
	var cnt rttCounter
	m := clientOn(b, benchRDB(b, addr, &cnt)).NewMutex(name)
	if m.TryLock() {
		b.Fatal("TryLock succeeded on a lock held by another Client")
	}
	b.ReportAllocs()
	cnt.reset()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if m.TryLock() {
			b.Fatal("TryLock succeeded on a lock held by another Client")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
}

// BenchmarkParallelDistinctKeys is Lock+Unlock from parallel goroutines of
// one Client, each on a lock of its own: the Client's shared state and
// connection pool under load, without contention for a lock.
func BenchmarkParallelDistinctKeys(b *testing.B) {
	for _, par := range []int{1, 4} {
		goroutines := par * runtime.GOMAXPROCS(0)
		b.Run("goroutines="+strconv.Itoa(goroutines), func(b *testing.B) {
			addr := benchAddr(b)
			var cnt rttCounter
			c := clientOn(b, benchRDB(b, addr, &cnt))
			base := benchName(b)
			warm := c.NewMutex(base)
			warm.Lock()
			warm.Unlock()
			var idx atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(par)
			cnt.reset()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				m := c.NewMutex(base + "." + strconv.FormatInt(idx.Add(1), 10))
				for pb.Next() {
					m.Lock()
					m.Unlock()
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
		})
	}
}

// BenchmarkContendedHandoff has 4 Clients (separate connection pools, as
// separate processes would have) with 2 goroutines each compete for one lock.
// A worker holds the lock for 1 ms (cs=sleep: time.Sleep, the usual case of
// a critical section doing I/O; cs=busy: spinning on the CPU) and pauses 1 ms
// after releasing it. One op is one acquisition; b.N acquisitions are shared
// out as the workers ask for them.
func BenchmarkContendedHandoff(b *testing.B) {
	for _, cs := range []string{"sleep", "busy"} {
		b.Run("cs="+cs, func(b *testing.B) { benchContended(b, cs == "busy") })
	}
}

func benchContended(b *testing.B, busy bool) {
	const (
		clients    = 4
		perClient  = 2
		workers    = clients * perClient
		critical   = time.Millisecond
		afterwards = time.Millisecond
	)
	addr := benchAddr(b)
	name := benchName(b)
	var cnt rttCounter
	mutexes := make([]*DistMutex, clients)
	for i := range mutexes {
		mutexes[i] = clientOn(b, benchRDB(b, addr, &cnt)).NewMutex(name)
		mutexes[i].Lock()
		mutexes[i].Unlock()
	}
	info := benchRDB(b, addr, nil)

	type result struct {
		waits []time.Duration
		gaps  []time.Duration
		held  time.Duration
	}
	var (
		epoch   = time.Now()
		freed   atomic.Int64 // when the last holder called Unlock, since epoch
		tickets atomic.Int64
		inside  atomic.Int32
		overlap atomic.Int64
		results = make([]result, workers)
		start   = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := 0; w < workers; w++ {
		m := mutexes[w%clients]
		r := &results[w]
		r.waits = make([]time.Duration, 0, b.N)
		r.gaps = make([]time.Duration, 0, b.N)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for tickets.Add(1) <= int64(b.N) {
				t0 := time.Now()
				m.Lock()
				t1 := time.Now()
				if !inside.CompareAndSwap(0, 1) {
					overlap.Add(1)
				}
				if f := freed.Load(); f > 0 {
					// Others always wait (the pause is as long as the
					// critical section), so this is the hand-off alone.
					r.gaps = append(r.gaps, t1.Sub(epoch)-time.Duration(f))
				}
				if busy {
					for time.Since(t1) < critical {
					}
				} else {
					time.Sleep(critical)
				}
				inside.Store(0)
				t2 := time.Now()
				freed.Store(int64(t2.Sub(epoch)))
				m.Unlock()
				r.waits = append(r.waits, t1.Sub(t0))
				r.held += t2.Sub(t1)
				time.Sleep(afterwards)
			}
		}()
	}

	cpu0, cpuErr := redisCPU(info)
	b.ReportAllocs()
	cnt.reset()
	b.ResetTimer()
	t0 := time.Now()
	close(start)
	wg.Wait()
	wall := time.Since(t0)
	b.StopTimer()
	cpu1, cpuErr1 := redisCPU(info)

	if n := overlap.Load(); n > 0 {
		b.Fatalf("%d acquisitions found another holder inside the critical section", n)
	}
	var (
		waits, gaps  []time.Duration
		held         time.Duration
		fewest, most = math.MaxInt, 0
	)
	for _, r := range results {
		waits = append(waits, r.waits...)
		gaps = append(gaps, r.gaps...)
		held += r.held
		fewest, most = min(fewest, len(r.waits)), max(most, len(r.waits))
	}
	acquisitions := len(waits)
	slices.Sort(waits)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(waits, 0.50)), "p50-ms")
	b.ReportMetric(ms(percentile(waits, 0.99)), "p99-ms")
	b.ReportMetric(ms(waits[len(waits)-1]), "max-ms")
	b.ReportMetric(100*float64(held)/float64(wall), "util-%")
	b.ReportMetric(ms(held)/float64(acquisitions), "held-ms")
	if len(gaps) > 0 {
		slices.Sort(gaps)
		b.ReportMetric(float64(percentile(gaps, 0.50).Microseconds()), "handoff-p50-us")
		b.ReportMetric(float64(percentile(gaps, 0.99).Microseconds()), "handoff-p99-us")
	}
	if fewest > 0 { // else too few acquisitions (b.N < workers) to tell
		b.ReportMetric(float64(most)/float64(fewest), "spread")
	}
	b.ReportMetric(float64(acquisitions)/wall.Seconds(), "acq/s")
	b.ReportMetric(float64(cnt.rtt.Load())/float64(acquisitions), "rtt/op")
	if cpuErr == nil && cpuErr1 == nil {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(acquisitions), "cpu-us/acq")
	}
}

// percentile returns the q-quantile of sorted (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// redisCPU returns the server's CPU time (user+sys) from INFO cpu; miniredis
// has none.
func redisCPU(rdb *redis.Client) (time.Duration, error) {
	s, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			total += f
			found++
		}
	}
	if found != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// processCPU returns the CPU time (user+sys) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWatchdog holds many locks at once and measures what keeping them
// costs: one op is one renewal period (lease/3). The holds are NonReentrant
// mutexes, which belong to the DistMutex rather than to a goroutine, so a few
// goroutines can take 10000 of them; reentrant holds would need a parked
// goroutine per hold, whose count would drown the one that matters here.
//
//	rtt/op                  renewal round trips (pipelines) per period
//	renewals/hold/op        renewals of each hold per period (1 = every lease/3)
//	goroutines              most goroutines running library code at once
//	lost                    holds lost while held (should be 0)
//	cpu-us/op               redis-server CPU per period
//	client-cpu-us/op        this process's CPU per period (the benchmark
//	                        itself only sleeps)
func BenchmarkWatchdog(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("holds="+strconv.Itoa(n), func(b *testing.B) { benchWatchdog(b, n) })
	}
}

func benchWatchdog(b *testing.B, holds int) {
	const (
		// Short enough for several renewals a second, long enough that a
		// 10000-key renewal round trip on a busy machine (it took up to 0.6s
		// on a loaded 2-core one) does not lose holds.
		lease  = time.Second
		period = lease / 3
		takers = 16
	)
	addr := benchAddr(b)
	var cnt rttCounter
	rdb := benchRDB(b, addr, &cnt)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	info := benchRDB(b, addr, nil)
	c := clientOn(b, rdb)
	base := benchName(b)
	mutexes := make([]*DistMutex, holds)
	var wg sync.WaitGroup
	for t := 0; t < takers; t++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := t; i < holds; i += takers {
				m := c.NewMutex(base+"."+strconv.Itoa(i), WithLease(lease), NonReentrant())
				m.Lock()
				mutexes[i] = m
			}
		}()
	}
	wg.Wait()

	cpu0, cpuErr := redisCPU(info)
	self0 := processCPU()
	b.ReportAllocs()
	cnt.reset()
	most := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(period)
		most = max(most, libraryGoroutines())
	}
	b.StopTimer()
	self1 := processCPU()
	cpu1, cpuErr1 := redisCPU(info)

	lost := 0
	for _, m := range mutexes {
		select {
		case <-m.Lost():
			lost++
		default:
		}
	}
	b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
	b.ReportMetric(float64(cnt.keys.Load())/float64(holds*b.N), "renewals/hold/op")
	b.ReportMetric(float64(most), "goroutines")
	b.ReportMetric(float64(lost), "lost")
	if cpuErr == nil && cpuErr1 == nil {
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
	}
	b.ReportMetric(float64((self1-self0).Microseconds())/float64(b.N), "client-cpu-us/op")
	// Closing drops the holds without a round trip each; the keys expire on
	// the server within the lease.
	_ = c.Close()
}

// libraryGoroutines counts the goroutines running this package's code, other
// than the caller: the watchdog, its renewal round trip while one is in
// flight, and the pub/sub reader.
func libraryGoroutines() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	count := 0
	for _, st := range stacks[1:] { // the first is the caller's
		if strings.Contains(st, "github.com/remutex/remutex.(*") {
			count++
		}
	}
	return count
}
