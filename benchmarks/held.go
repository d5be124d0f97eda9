package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

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
	t0 := time.Now()
	ms, err := takeLocks(ctx, cl, locks, takeLimit)
	if err != nil {
		return res, err
	}
	res.AcquireTime = time.Since(t0)
	res.Taken = len(ms)

	res.Renewer = "library"
	if !v.watchdog {
		res.Renewer = fmt.Sprintf("user loop: %d goroutines, extend every lease/3", userRenewers)
	}
	meter := startMeter(srv, &w)
	var loop *userLoop
	if !v.watchdog {
		loop = startUserLoop(ctx, ms, lease)
	}
	res.Goroutines = mostGoroutines(res.Held, g0)
	if loop != nil {
		res.Renewals, res.RenewErrors = loop.end()
	}
	spent := meter.stop()
	u, sent := spent.used, spent.sent
	res.Bursts = sent.Bursts
	res.Commands = sent.Commands
	res.Executed = u.executed()
	res.CPU = u.cpu
	res.Server = u.cmds
	for _, m := range ms {
		if m.lost() {
			res.Lost++
		}
	}
	releaseAll(ctx, ms, takeLimit)
	return res, nil
}

// takeLocks takes up to n locks of cl, one after the other, for up to limit.
// One goroutine takes them all: remutex's holds belong to the goroutine that
// took them, and a goroutine may hold any number of distinct locks. A library
// that takes longer than limit to take them all is measured with the locks it
// took by then.
func takeLocks(ctx context.Context, cl client, n int, limit time.Duration) ([]mutex, error) {
	base := lockName("held")
	ms := make([]mutex, 0, n)
	t0 := time.Now()
	for i := 0; i < n && time.Since(t0) < limit; i++ {
		m := cl.mutex(base + ":" + strconv.Itoa(i))
		if err := m.lock(ctx); err != nil {
			return nil, fmt.Errorf("lock %d: %w", i, err)
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// releaseAll releases the holds that were not lost, for up to limit: what is
// left expires with its lease once the client is closed.
func releaseAll(ctx context.Context, ms []mutex, limit time.Duration) {
	t1 := time.Now()
	for _, m := range ms {
		if time.Since(t1) > limit {
			break
		}
		if !m.lost() {
			_ = m.unlock(ctx)
		}
	}
}

// mostGoroutines watches the number of goroutines for d and returns the most
// above g0.
func mostGoroutines(d time.Duration, g0 int) int {
	most := 0
	for end := time.Now().Add(d); time.Now().Before(end); {
		most = max(most, runtime.NumGoroutine()-g0)
		time.Sleep(20 * time.Millisecond)
	}
	return most
}

// userLoop is what a user of a library without a watchdog writes: goroutines
// that extend every held lock every lease/3.
type userLoop struct {
	stop               chan struct{}
	wg                 sync.WaitGroup
	renewals, failures atomic.Int64
}

// startUserLoop starts userRenewers goroutines, each extending its share of
// ms every lease/3.
func startUserLoop(ctx context.Context, ms []mutex, lease time.Duration) *userLoop {
	u := &userLoop{stop: make(chan struct{})}
	for r := 0; r < userRenewers; r++ {
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			tick := time.NewTicker(lease / 3)
			defer tick.Stop()
			for {
				select {
				case <-u.stop:
					return
				case <-tick.C:
				}
				for i := r; i < len(ms); i += userRenewers {
					u.renewals.Add(1)
					if err := ms[i].(extender).extend(ctx); err != nil {
						u.failures.Add(1)
					}
				}
			}
		}()
	}
	return u
}

// end stops the loop and returns its extend calls and how many failed.
func (u *userLoop) end() (renewals, failures int64) {
	close(u.stop)
	u.wg.Wait()
	return u.renewals.Load(), u.failures.Load()
}
