package main

import (
	"cmp"
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

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
	HoldMean     time.Duration // Lock returned -> Unlock called: the sleep and its overshoot
	GapMean      time.Duration // release (Unlock called) -> next acquisition
	GapP50       time.Duration
	WaitP50      time.Duration // Lock called -> Lock returned
	WaitP99      time.Duration
	WaitMax      time.Duration
	Spread       float64 // most / fewest acquisitions of one worker (window); -1: a worker had none
	PerWorker    []int
	Overlaps     int64 // acquisitions that found another holder inside
	Errors       int64
	perCycle         // per acquisition, the drain included: round trips of all clients, commands, Redis CPU, ...
	AllAcq       int // acquisitions including the drain after the window
	FirstErr     string
	Rounds       []float64 // utilisation of each round, in %

	waits []time.Duration // every acquisition's, sorted (merged across rounds)
	spent spent           // all rounds'
}

// mergeRounds sums up the rounds of one variant. Rate, utilisation and gap
// are the round's of the median utilisation; the wait percentiles are of
// all rounds' acquisitions together, as in one long window; acquisitions per
// worker, overlaps and errors are summed, and what Redis did is per
// acquisition over all rounds.
func mergeRounds(rs []contendedResult) contendedResult {
	byUtil := slices.Clone(rs)
	slices.SortFunc(byUtil, func(a, b contendedResult) int { return cmp.Compare(a.Utilisation, b.Utilisation) })
	m := byUtil[len(byUtil)/2]
	res := contendedResult{PerSecond: m.PerSecond, Utilisation: m.Utilisation, HoldMean: m.HoldMean, GapMean: m.GapMean, GapP50: m.GapP50,
		PerWorker: make([]int, len(m.PerWorker))}
	for _, r := range rs {
		res.Rounds = append(res.Rounds, math.Round(1000*r.Utilisation)/10)
		res.Window += r.Window
		res.Acquisitions += r.Acquisitions
		res.AllAcq += r.AllAcq
		res.waits = append(res.waits, r.waits...)
		res.Overlaps += r.Overlaps
		res.Errors += r.Errors
		if res.FirstErr == "" {
			res.FirstErr = r.FirstErr
		}
		for i, n := range r.PerWorker {
			res.PerWorker[i] += n
		}
		res.spent = res.spent.add(r.spent)
	}
	res.perCycle = res.spent.per(float64(res.AllAcq))
	res.Spread = workerSpread(res.PerWorker)
	res.setWaits()
	return res
}

// setWaits sorts the waits and takes their percentiles.
func (res *contendedResult) setWaits() {
	slices.Sort(res.waits)
	res.WaitP50 = percentile(res.waits, 0.5)
	res.WaitP99 = percentile(res.waits, 0.99)
	res.WaitMax = res.waits[len(res.waits)-1]
}

type acqRecord struct {
	t0, t1, t2 time.Duration // since start: Lock called, Lock returned, Unlock called
	worker     int
}

// contended runs the hand-off for the span sp: a duration, or until sp.ops
// acquisitions (under callgrind, where what counts is the instructions per
// acquisition, every one of them counted).
func contended(v variant, srv *server, sp span) (contendedResult, error) {
	var w wire
	clients, err := connectAll(v, srv.config(&w), contClients)
	if err != nil {
		return contendedResult{}, err
	}
	defer closeAll(clients)
	h, err := newHandoff(clients, lockName("handoff"))
	if err != nil {
		return contendedResult{}, err
	}

	// The drain after the window is bounded: a waiter still waiting 10s
	// (a minute under callgrind) after it gives up.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for wk := range h.mutexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.work(ctx, wk)
		}()
	}

	runtime.GC()
	meter := startMeter(srv, &w)
	h.start = time.Now()
	close(h.begin)
	window := h.await(sp)
	h.stop.Store(true)
	drain := time.AfterFunc(sp.drainLimit(), cancel)
	wg.Wait()
	drain.Stop()
	spent := meter.stop()
	if spent.err != nil {
		return contendedResult{}, spent.err
	}

	res, err := h.result(window)
	if err != nil {
		return res, err
	}
	res.spent = spent
	res.perCycle = spent.per(float64(res.AllAcq))
	return res, nil
}

// await waits for the span to end and returns the window: its duration, or
// until the sp.ops'th acquisition, for up to contCountLimit.
func (h *handoff) await(sp span) time.Duration {
	if !sp.counting() {
		time.Sleep(sp.d)
		return sp.d
	}
	for time.Since(h.start) < contCountLimit && h.acquired.Load() < int64(sp.ops) {
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(h.start)
}

// contCountLimit is the longest a counted hand-off runs, however few
// acquisitions it made.
const contCountLimit = 2 * time.Minute

// connectAll connects n clients of v, each with its own pool, or none.
func connectAll(v variant, cfg config, n int) ([]client, error) {
	clients := make([]client, 0, n)
	for range n {
		cl, err := v.connect(cfg)
		if err != nil {
			closeAll(clients)
			return nil, err
		}
		clients = append(clients, cl)
	}
	return clients, nil
}

func closeAll(clients []client) {
	for _, cl := range clients {
		cl.close()
	}
}

// handoff is one run of the contended scenario: contPerClient workers per
// client on one lock, and what they saw.
type handoff struct {
	mutexes  []mutex       // one per worker
	begin    chan struct{} // closed at start
	start    time.Time     // set before begin is closed
	stop     atomic.Bool   // the window has ended
	acquired atomic.Int64  // acquisitions so far
	inside   atomic.Int32  // holders inside the critical section
	overlaps atomic.Int64  // holders that found another inside
	errs     atomic.Int64
	firstErr atomic.Value  // string
	records  [][]acqRecord // per worker, set when it ends
}

// newHandoff makes the workers' mutexes on the lock name and warms them up:
// every worker takes the lock once, all at once, so that the scripts of the
// contended path are loaded (a first EVAL compiles one) and the clients'
// connections are open before anything is measured.
func newHandoff(clients []client, name string) (*handoff, error) {
	workers := len(clients) * contPerClient
	h := &handoff{mutexes: make([]mutex, workers), begin: make(chan struct{}), records: make([][]acqRecord, workers)}
	for i := range h.mutexes {
		h.mutexes[i] = clients[i%len(clients)].mutex(name)
	}
	warm := context.Background()
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for _, m := range h.mutexes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.lock(warm); err != nil {
				errs <- err
				return
			}
			time.Sleep(contCritical)
			if err := m.unlock(warm); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return h, <-errs
}

// work is worker wk: from begin until stop, it locks, holds for contCritical,
// unlocks and pauses for contPause, recording each acquisition.
func (h *handoff) work(ctx context.Context, wk int) {
	m := h.mutexes[wk]
	recs := make([]acqRecord, 0, 8192)
	defer func() { h.records[wk] = recs }()
	<-h.begin
	for !h.stop.Load() {
		t0 := time.Since(h.start)
		if err := m.lock(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			h.fail(err)
			time.Sleep(contPause)
			continue
		}
		t1 := time.Since(h.start)
		h.acquired.Add(1)
		if !h.inside.CompareAndSwap(0, 1) {
			h.overlaps.Add(1)
		}
		time.Sleep(contCritical)
		h.inside.Store(0)
		t2 := time.Since(h.start)
		if err := m.unlock(context.Background()); err != nil {
			h.fail(err)
		}
		recs = append(recs, acqRecord{t0, t1, t2, wk})
		time.Sleep(contPause)
	}
}

// fail counts an error of lock or unlock, keeping the first.
func (h *handoff) fail(err error) {
	h.errs.Add(1)
	h.firstErr.CompareAndSwap(nil, err.Error())
}

// result sums up the acquisitions: those inside the window for the rates,
// utilisation and spread; all of them for the overlaps and waits.
func (h *handoff) result(window time.Duration) (contendedResult, error) {
	var all []acqRecord
	for _, rs := range h.records {
		all = append(all, rs...)
	}
	slices.SortFunc(all, func(a, b acqRecord) int { return int(a.t1 - b.t1) })
	res := contendedResult{Window: window, Overlaps: h.overlaps.Load(), Errors: h.errs.Load(), AllAcq: len(all)}
	if s, ok := h.firstErr.Load().(string); ok {
		res.FirstErr = s
	}
	// The records themselves must not overlap either: sorted by acquisition,
	// each must start after the previous holder called Unlock.
	for i := 1; i < len(all); i++ {
		if all[i].t1 < all[i-1].t2 {
			res.Overlaps++
		}
	}
	if err := res.addTimes(all, len(h.mutexes)); err != nil {
		return res, err
	}
	return res, nil
}

// addTimes fills in the figures of time and fairness from all acquisitions,
// sorted by the time they returned from lock.
func (res *contendedResult) addTimes(all []acqRecord, workers int) error {
	window := res.Window
	res.PerWorker = make([]int, workers)
	var (
		held time.Duration
		gaps []time.Duration
	)
	for i, r := range all {
		res.waits = append(res.waits, r.t1-r.t0)
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
		return errors.New("no acquisition at all")
	}
	res.PerSecond = float64(res.Acquisitions) / window.Seconds()
	res.Utilisation = float64(held) / float64(window)
	if res.Acquisitions > 0 {
		res.HoldMean = held / time.Duration(res.Acquisitions)
	}
	res.GapMean = mean(gaps)
	slices.Sort(gaps)
	res.GapP50 = percentile(gaps, 0.5)
	res.setWaits()
	res.Spread = workerSpread(res.PerWorker)
	return nil
}

// workerSpread is the most over the fewest acquisitions of one worker; -1 (a
// worker that never acquired) for unbounded.
func workerSpread(perWorker []int) float64 {
	fewest, most := slices.Min(perWorker), slices.Max(perWorker)
	if fewest == 0 {
		return -1
	}
	return float64(most) / float64(fewest)
}
