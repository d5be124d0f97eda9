package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// names hands out lock names used by no other scenario of the run.
var nameSeq atomic.Int64

func lockName(scenario string) string {
	return "bench:" + scenario + ":" + strconv.FormatInt(nameSeq.Add(1), 10)
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// ---------------------------------------------------------------- floor

// floorResult is the cost of one round trip: PING answered on the same
// connection, one after the other, measured in every round of the
// uncontended scenario next to the libraries.
type floorResult struct {
	RTT      time.Duration // go-redis Client.Ping: median of the rounds' means
	P50      time.Duration // go-redis, over all pings
	Raw      time.Duration // PING written and read on a bare socket: median of the rounds' means
	RawP50   time.Duration
	Pings    int
	rounds   []time.Duration
	rawRound []time.Duration
	lat, raw []time.Duration
}

// floorRound measures PINGs for d: half through go-redis, half on a bare
// socket.
func floorRound(addr string, d time.Duration, r *floorResult) error {
	var w wire
	rdb := goRedis(addr, &w)
	defer rdb.Close()
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return err
		}
	}
	n0 := len(r.lat)
	start := time.Now()
	for end := start.Add(d / 2); time.Now().Before(end); {
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return err
		}
		r.lat = append(r.lat, time.Since(t0))
	}
	r.rounds = append(r.rounds, time.Since(start)/time.Duration(len(r.lat)-n0))

	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ping := []byte("*1\r\n$4\r\nPING\r\n")
	one := func() error {
		if _, err := c.Write(ping); err != nil {
			return err
		}
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if line != "+PONG\r\n" {
			return fmt.Errorf("PING answered %q", line)
		}
		return nil
	}
	for i := 0; i < 100; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	n0 = len(r.raw)
	start = time.Now()
	for end := start.Add(d / 2); time.Now().Before(end); {
		t0 := time.Now()
		if err := one(); err != nil {
			return err
		}
		r.raw = append(r.raw, time.Since(t0))
	}
	r.rawRound = append(r.rawRound, time.Since(start)/time.Duration(len(r.raw)-n0))
	return nil
}

func (r *floorResult) finish() {
	r.Pings = len(r.lat) + len(r.raw)
	r.RTT, r.Raw = median(r.rounds), median(r.rawRound)
	slices.Sort(r.lat)
	slices.Sort(r.raw)
	r.P50, r.RawP50 = percentile(r.lat, 0.5), percentile(r.raw, 0.5)
	r.lat, r.raw = nil, nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// ---------------------------------------------------------------- sanity

// checkExclusion makes sure a variant excludes across clients: a lock held by
// one client cannot be taken by another's tryLock, and is free again after
// unlock.
func checkExclusion(v variant, addr string) error {
	ctx := context.Background()
	var w wire
	a, err := v.connect(config{addr: addr, wire: &w})
	if err != nil {
		return err
	}
	defer a.close()
	b, err := v.connect(config{addr: addr, wire: &w})
	if err != nil {
		return err
	}
	defer b.close()
	name := lockName("check")
	ma, mb := a.mutex(name), b.mutex(name)
	if err := ma.lock(ctx); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	ok, err := mb.tryLock(ctx)
	if err != nil {
		return fmt.Errorf("tryLock of a held lock: %w", err)
	}
	if ok {
		return errors.New("tryLock took a lock held by another client")
	}
	if err := ma.unlock(ctx); err != nil {
		return fmt.Errorf("unlock: %w", err)
	}
	// Some libraries announce the release asynchronously: allow a moment.
	for deadline := time.Now().Add(2 * time.Second); ; {
		ok, err = mb.tryLock(ctx)
		if err != nil {
			return fmt.Errorf("tryLock of a free lock: %w", err)
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !ok {
		return errors.New("tryLock failed on a released lock")
	}
	return mb.unlock(ctx)
}

// ---------------------------------------------------------------- uncontended

// cycleResult is the uncontended Lock+Unlock cycle on one client.
type cycleResult struct {
	Cycles   int
	Cycle    time.Duration      // median over rounds of the mean cycle time
	P50, P99 time.Duration      // over all cycles
	Allocs   float64            // heap allocations per cycle (all goroutines)
	Bytes    float64            // heap bytes per cycle
	Bursts   float64            // write bursts (round trips) per cycle
	Commands float64            // commands sent per cycle
	Executed float64            // commands executed per cycle, inside scripts included
	CPU      time.Duration      // redis-server CPU per cycle
	Server   map[string]cmdStat // INFO commandstats over all cycles
	rounds   []time.Duration
	lat      []time.Duration
	mallocs  uint64
	heap     uint64
	used     usage
	sent     wireSnapshot
}

// uncontendedRound runs Lock+Unlock cycles on one fresh client for d and adds
// them to r.
func uncontendedRound(v variant, srv *server, d time.Duration, r *cycleResult) error {
	ctx := context.Background()
	var w wire
	cl, err := v.connect(config{addr: srv.addr, wire: &w})
	if err != nil {
		return err
	}
	defer cl.close()
	m := cl.mutex(lockName("cycle"))
	for i := 0; i < 200; i++ { // load scripts, open connections, warm caches
		if err := m.lock(ctx); err != nil {
			return err
		}
		if err := m.unlock(ctx); err != nil {
			return err
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	u0 := srv.usage()
	w0 := w.snapshot()
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	end := start.Add(d)
	for t0 := start; t0.Before(end); {
		if err := m.lock(ctx); err != nil {
			return err
		}
		if err := m.unlock(ctx); err != nil {
			return err
		}
		t1 := time.Now()
		lat = append(lat, t1.Sub(t0))
		t0 = t1
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	w1 := w.snapshot()
	u1 := srv.usage()
	r.lat = append(r.lat, lat...)
	r.rounds = append(r.rounds, elapsed/time.Duration(len(lat)))
	r.mallocs += ms1.Mallocs - ms0.Mallocs
	r.heap += ms1.TotalAlloc - ms0.TotalAlloc
	if r.used.cmds == nil {
		r.used = usage{cmds: map[string]cmdStat{}}
	}
	r.used = r.used.add(u1.sub(u0))
	r.sent = r.sent.add(w1.sub(w0))
	return nil
}

func (r *cycleResult) finish() {
	n := float64(len(r.lat))
	r.Cycles = len(r.lat)
	if n == 0 {
		return
	}
	r.Cycle = median(r.rounds)
	slices.Sort(r.lat)
	r.P50, r.P99 = percentile(r.lat, 0.5), percentile(r.lat, 0.99)
	r.Allocs = float64(r.mallocs) / n
	r.Bytes = float64(r.heap) / n
	r.Bursts = float64(r.sent.Bursts) / n
	r.Commands = float64(r.sent.Commands) / n
	r.Executed = float64(r.used.executed()) / n
	r.CPU = time.Duration(float64(r.used.cpu) / n)
	r.Server = r.used.cmds
	r.lat = nil
}

// ---------------------------------------------------------------- contended

// Contended hand-off: 4 clients × 2 goroutines on one lock. A worker holds the
// lock for 1 ms (time.Sleep: a critical section that waits on I/O) and pauses
// 1 ms after releasing it.
const (
	contClients   = 4
	contPerClient = 2
	contCritical  = time.Millisecond
	contPause     = time.Millisecond
)

type contendedResult struct {
	Window       time.Duration // measuring window
	Acquisitions int           // acquired inside the window
	PerSecond    float64
	Utilisation  float64       // time held / window
	GapMean      time.Duration // release (Unlock called) -> next acquisition
	GapP50       time.Duration
	WaitP50      time.Duration // Lock called -> Lock returned
	WaitP99      time.Duration
	WaitMax      time.Duration
	Spread       float64 // most / fewest acquisitions of one worker (window); -1: a worker had none
	PerWorker    []int
	Overlaps     int64 // acquisitions that found another holder inside
	Errors       int64
	Bursts       float64       // write bursts per acquisition, all clients
	Commands     float64       // commands sent per acquisition
	Executed     float64       // commands executed per acquisition, scripts' included
	CPU          time.Duration // redis-server CPU per acquisition
	Server       map[string]cmdStat
	AllAcq       int // acquisitions including the drain after the window
	FirstErr     string
}

type acqRecord struct {
	t0, t1, t2 time.Duration // since start: Lock called, Lock returned, Unlock called
	worker     int
}

func contended(v variant, srv *server, window time.Duration) (contendedResult, error) {
	var res contendedResult
	var w wire
	clients := make([]client, contClients)
	for i := range clients {
		cl, err := v.connect(config{addr: srv.addr, wire: &w})
		if err != nil {
			return res, err
		}
		defer cl.close()
		clients[i] = cl
	}
	name := lockName("handoff")
	workers := contClients * contPerClient
	mutexes := make([]mutex, workers)
	warm := context.Background()
	for i := range mutexes {
		mutexes[i] = clients[i%contClients].mutex(name)
		if err := mutexes[i].lock(warm); err != nil {
			return res, err
		}
		if err := mutexes[i].unlock(warm); err != nil {
			return res, err
		}
	}

	// The drain after the window is bounded: a waiter still waiting 10s
	// after it gives up.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		stop     atomic.Bool
		inside   atomic.Int32
		overlaps atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
		records  = make([][]acqRecord, workers)
		begin    = make(chan struct{})
		wg       sync.WaitGroup
		start    time.Time
	)
	for wk := 0; wk < workers; wk++ {
		m := mutexes[wk]
		recs := make([]acqRecord, 0, 8192)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { records[wk] = recs }()
			<-begin
			for !stop.Load() {
				t0 := time.Since(start)
				if err := m.lock(ctx); err != nil {
					if ctx.Err() != nil {
						return
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					time.Sleep(contPause)
					continue
				}
				t1 := time.Since(start)
				if !inside.CompareAndSwap(0, 1) {
					overlaps.Add(1)
				}
				time.Sleep(contCritical)
				inside.Store(0)
				t2 := time.Since(start)
				if err := m.unlock(context.Background()); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
				recs = append(recs, acqRecord{t0, t1, t2, wk})
				time.Sleep(contPause)
			}
		}()
	}

	runtime.GC()
	u0 := srv.usage()
	w0 := w.snapshot()
	start = time.Now()
	close(begin)
	time.Sleep(window)
	stop.Store(true)
	drain := time.AfterFunc(10*time.Second, cancel)
	wg.Wait()
	drain.Stop()
	w1 := w.snapshot()
	u1 := srv.usage()

	var all []acqRecord
	for _, rs := range records {
		all = append(all, rs...)
	}
	slices.SortFunc(all, func(a, b acqRecord) int { return int(a.t1 - b.t1) })
	res.Window = window
	res.Overlaps = overlaps.Load()
	res.Errors = errs.Load()
	if s, ok := firstErr.Load().(string); ok {
		res.FirstErr = s
	}
	// The records themselves must not overlap either: sorted by acquisition,
	// each must start after the previous holder called Unlock.
	for i := 1; i < len(all); i++ {
		if all[i].t1 < all[i-1].t2 {
			res.Overlaps++
		}
	}
	res.AllAcq = len(all)
	res.PerWorker = make([]int, workers)
	var (
		held  time.Duration
		waits []time.Duration
		gaps  []time.Duration
	)
	for i, r := range all {
		waits = append(waits, r.t1-r.t0)
		if r.t1 >= window {
			continue
		}
		res.Acquisitions++
		res.PerWorker[r.worker]++
		held += min(r.t2, window) - r.t1
		if i > 0 {
			gaps = append(gaps, r.t1-all[i-1].t2)
		}
	}
	if len(all) == 0 {
		return res, errors.New("no acquisition at all")
	}
	res.PerSecond = float64(res.Acquisitions) / window.Seconds()
	res.Utilisation = float64(held) / float64(window)
	res.GapMean = mean(gaps)
	slices.Sort(gaps)
	res.GapP50 = percentile(gaps, 0.5)
	slices.Sort(waits)
	res.WaitP50 = percentile(waits, 0.5)
	res.WaitP99 = percentile(waits, 0.99)
	res.WaitMax = waits[len(waits)-1]
	fewest, most := slices.Min(res.PerWorker), slices.Max(res.PerWorker)
	res.Spread = -1 // a worker that never acquired: unbounded
	if fewest > 0 {
		res.Spread = float64(most) / float64(fewest)
	}
	n := float64(len(all))
	u := u1.sub(u0)
	sent := w1.sub(w0)
	res.Bursts = float64(sent.Bursts) / n
	res.Commands = float64(sent.Commands) / n
	res.Executed = float64(u.executed()) / n
	res.CPU = time.Duration(float64(u.cpu) / n)
	res.Server = u.cmds
	return res, nil
}

// ---------------------------------------------------------------- many held

// heldResult is the cost of keeping many locks held by one client for three
// lease periods.
type heldResult struct {
	Locks       int
	Taken       int // locks taken within the time allowed for taking them
	Lease       time.Duration
	Held        time.Duration // measured span: 3 leases
	Renewer     string        // who renews: the library, or a loop the user writes
	Bursts      int64         // write bursts (round trips) during the span
	Commands    int64         // commands sent during the span
	Executed    int64         // commands executed, scripts' included
	CPU         time.Duration // redis-server CPU during the span
	Goroutines  int           // most goroutines above the count before the client existed
	Lost        int           // holds lost by the end of the span
	Renewals    int64         // extend calls the user loop made (no watchdog)
	RenewErrors int64
	AcquireTime time.Duration // taking all locks, one after the other
	Server      map[string]cmdStat
}

// userRenewers is how many goroutines the user loop of a library without a
// watchdog spreads its extend calls over: one goroutine issuing 10,000
// sequential round trips cannot keep up with short leases.
const userRenewers = 8

func manyHeld(v variant, srv *server, locks int, lease, takeLimit time.Duration) (heldResult, error) {
	res := heldResult{Locks: locks, Lease: lease, Held: 3 * lease}
	ctx := context.Background()
	runtime.GC()
	g0 := runtime.NumGoroutine()
	var w wire
	cl, err := v.connect(config{addr: srv.addr, wire: &w, lease: lease})
	if err != nil {
		return res, err
	}
	defer cl.close()
	// One goroutine takes every lock, checks and releases them: remutex's
	// holds belong to the goroutine that took them, and a goroutine may hold
	// any number of distinct locks.
	// A library that takes longer than takeLimit to take them all is
	// measured with the locks it took by then.
	base := lockName("held")
	ms := make([]mutex, 0, locks)
	t0 := time.Now()
	for i := 0; i < locks && time.Since(t0) < takeLimit; i++ {
		m := cl.mutex(base + ":" + strconv.Itoa(i))
		if err := m.lock(ctx); err != nil {
			return res, fmt.Errorf("lock %d: %w", i, err)
		}
		ms = append(ms, m)
	}
	res.AcquireTime = time.Since(t0)
	res.Taken = len(ms)

	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		renewals atomic.Int64
		failures atomic.Int64
	)
	if v.watchdog {
		res.Renewer = "library"
	} else {
		res.Renewer = fmt.Sprintf("user loop: %d goroutines, extend every lease/3", userRenewers)
	}
	u0 := srv.usage()
	w0 := w.snapshot()
	begin := time.Now()
	if !v.watchdog {
		for r := 0; r < userRenewers; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(lease / 3)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					for i := r; i < len(ms); i += userRenewers {
						renewals.Add(1)
						if err := ms[i].(extender).extend(ctx); err != nil {
							failures.Add(1)
						}
					}
				}
			}()
		}
	}
	most := 0
	for end := begin.Add(res.Held); time.Now().Before(end); {
		most = max(most, runtime.NumGoroutine()-g0)
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	w1 := w.snapshot()
	u1 := srv.usage()
	u := u1.sub(u0)
	sent := w1.sub(w0)
	res.Bursts = sent.Bursts
	res.Commands = sent.Commands
	res.Executed = u.executed()
	res.CPU = u.cpu
	res.Server = u.cmds
	res.Goroutines = most
	res.Renewals = renewals.Load()
	res.RenewErrors = failures.Load()
	for _, m := range ms {
		if m.lost() {
			res.Lost++
		}
	}
	// Release them, within the same bound: what is left expires with its
	// lease once the client is closed.
	t1 := time.Now()
	for _, m := range ms {
		if time.Since(t1) > takeLimit {
			break
		}
		if !m.lost() {
			_ = m.unlock(ctx)
		}
	}
	return res, nil
}

// ---------------------------------------------------------------- nested

// nestedResult is a nested Lock and its Unlock on a lock the goroutine
// already holds (remutex only: the others are not reentrant). Each iteration
// also sends one PING on a connection of its own, so that the round trip it
// is compared with is measured at the same moments.
type nestedResult struct {
	Pairs         int
	Lock, Unlock  time.Duration // mean
	LockP50       time.Duration
	UnlockP50     time.Duration
	Ping, PingP50 time.Duration // the interleaved PINGs
	Allocs        float64       // per nested Lock+Unlock pair
	Bursts        float64       // round trips per nested Lock+Unlock pair
	Commands      float64       // commands sent per nested pair
	Executed      float64       // commands executed per nested pair
	Server        map[string]cmdStat
}

func nested(v variant, srv *server, d time.Duration) (nestedResult, error) {
	var res nestedResult
	ctx := context.Background()
	var w, pw wire
	cl, err := v.connect(config{addr: srv.addr, wire: &w})
	if err != nil {
		return res, err
	}
	defer cl.close()
	pinger := goRedis(srv.addr, &pw)
	defer pinger.Close()
	m := cl.mutex(lockName("nested"))
	if err := m.lock(ctx); err != nil {
		return res, err
	}
	defer m.unlock(ctx)
	for i := 0; i < 200; i++ {
		if err := pinger.Ping(ctx).Err(); err != nil {
			return res, err
		}
		if err := m.lock(ctx); err != nil {
			return res, err
		}
		if err := m.unlock(ctx); err != nil {
			return res, err
		}
	}
	pings := make([]time.Duration, 0, 1<<16)
	locks := make([]time.Duration, 0, 1<<16)
	unlocks := make([]time.Duration, 0, 1<<16)
	runtime.GC()
	var ms0, ms1 runtime.MemStats
	var pingAllocs uint64
	u0 := srv.usage()
	w0 := w.snapshot()
	runtime.ReadMemStats(&ms0)
	for end := time.Now().Add(d); time.Now().Before(end); {
		t0 := time.Now()
		if err := pinger.Ping(ctx).Err(); err != nil {
			return res, err
		}
		t1 := time.Now()
		if err := m.lock(ctx); err != nil {
			return res, err
		}
		t2 := time.Now()
		if err := m.unlock(ctx); err != nil {
			return res, err
		}
		t3 := time.Now()
		pings = append(pings, t1.Sub(t0))
		locks = append(locks, t2.Sub(t1))
		unlocks = append(unlocks, t3.Sub(t2))
	}
	runtime.ReadMemStats(&ms1)
	w1 := w.snapshot()
	u1 := srv.usage()
	// What the PINGs allocate, measured alone, is taken off.
	{
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		for i := 0; i < 1000; i++ {
			_ = pinger.Ping(ctx).Err()
		}
		runtime.ReadMemStats(&b)
		pingAllocs = (b.Mallocs - a.Mallocs) / 1000
	}
	n := len(locks)
	res.Pairs = n
	res.Ping, res.Lock, res.Unlock = mean(pings), mean(locks), mean(unlocks)
	slices.Sort(pings)
	slices.Sort(locks)
	slices.Sort(unlocks)
	res.PingP50, res.LockP50, res.UnlockP50 = percentile(pings, 0.5), percentile(locks, 0.5), percentile(unlocks, 0.5)
	res.Allocs = float64(ms1.Mallocs-ms0.Mallocs)/float64(n) - float64(pingAllocs)
	sent := w1.sub(w0)
	u := u1.sub(u0)
	delete(u.cmds, "ping")
	res.Bursts = float64(sent.Bursts) / float64(n)
	res.Commands = float64(sent.Commands) / float64(n)
	res.Executed = float64(u.executed()) / float64(n)
	res.Server = u.cmds
	return res, nil
}
