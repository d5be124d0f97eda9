package main

import (
	"context"
	"runtime"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

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
	ctx := context.Background()
	var w, pw wire
	cl, err := v.connect(config{addr: srv.addr, wire: &w})
	if err != nil {
		return nestedResult{}, err
	}
	defer cl.close()
	pinger := goRedis(config{addr: srv.addr, wire: &pw})
	defer pinger.Close()
	m := cl.mutex(lockName("nested"))
	if err := m.lock(ctx); err != nil {
		return nestedResult{}, err
	}
	defer m.unlock(ctx)
	for i := 0; i < 200; i++ {
		if _, err := nestedPair(ctx, pinger, m); err != nil {
			return nestedResult{}, err
		}
	}
	pings := make([]time.Duration, 0, 1<<16)
	locks := make([]time.Duration, 0, 1<<16)
	unlocks := make([]time.Duration, 0, 1<<16)
	runtime.GC()
	meter := startMeter(srv, &w)
	for end := time.Now().Add(d); time.Now().Before(end); {
		t, err := nestedPair(ctx, pinger, m)
		if err != nil {
			return nestedResult{}, err
		}
		pings, locks, unlocks = append(pings, t[0]), append(locks, t[1]), append(unlocks, t[2])
	}
	spent := meter.stop()

	n := len(locks)
	res := nestedResult{Pairs: n}
	res.Ping, res.Lock, res.Unlock = mean(pings), mean(locks), mean(unlocks)
	slices.Sort(pings)
	slices.Sort(locks)
	slices.Sort(unlocks)
	res.PingP50, res.LockP50, res.UnlockP50 = percentile(pings, 0.5), percentile(locks, 0.5), percentile(unlocks, 0.5)
	res.Allocs = float64(spent.mallocs)/float64(n) - float64(pingAllocs(ctx, pinger))
	sent, u := spent.sent, spent.used
	delete(u.cmds, "ping")
	res.Bursts = float64(sent.Bursts) / float64(n)
	res.Commands = float64(sent.Commands) / float64(n)
	res.Executed = float64(u.executed()) / float64(n)
	res.Server = u.cmds
	return res, nil
}

// nestedPair sends a PING, then a nested Lock and its Unlock of m, and
// returns the time each took.
func nestedPair(ctx context.Context, pinger *redis.Client, m mutex) ([3]time.Duration, error) {
	var t [3]time.Duration
	t0 := time.Now()
	if err := pinger.Ping(ctx).Err(); err != nil {
		return t, err
	}
	t1 := time.Now()
	if err := m.lock(ctx); err != nil {
		return t, err
	}
	t2 := time.Now()
	if err := m.unlock(ctx); err != nil {
		return t, err
	}
	t3 := time.Now()
	return [3]time.Duration{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)}, nil
}

// pingAllocs is what one PING allocates, measured alone: the nested figures
// take it off.
func pingAllocs(ctx context.Context, pinger *redis.Client) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for i := 0; i < 1000; i++ {
		_ = pinger.Ping(ctx).Err()
	}
	runtime.ReadMemStats(&b)
	return (b.Mallocs - a.Mallocs) / 1000
}
