package main

import (
	"context"
	"runtime"
	"slices"
	"time"
)

// cycleResult is the uncontended Lock+Unlock cycle on one client.
type cycleResult struct {
	Cycles   int
	Cycle    time.Duration // median over rounds of the mean cycle time
	P50, P99 time.Duration // over all cycles
	perCycle
	rounds []time.Duration
	lat    []time.Duration
	spent  spent
}

// uncontendedRound runs Lock+Unlock cycles on one fresh client for the span
// sp and adds them to r.
func uncontendedRound(v variant, srv *server, sp span, r *cycleResult) error {
	ctx := context.Background()
	var w wire
	cl, err := v.connect(srv.config(&w))
	if err != nil {
		return err
	}
	defer cl.close()
	m := cl.mutex(lockName("cycle"))
	for range sp.warmUp() {
		if err := m.lock(ctx); err != nil {
			return err
		}
		if err := m.unlock(ctx); err != nil {
			return err
		}
	}
	lat := make([]time.Duration, 0, 1<<16)
	runtime.GC()
	meter := startMeter(srv, &w)
	start := time.Now()
	for t0 := start; !sp.over(t0.Sub(start), len(lat)); {
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
	spent := meter.stop()
	if spent.err != nil {
		return spent.err
	}
	r.lat = append(r.lat, lat...)
	r.rounds = append(r.rounds, elapsed/time.Duration(len(lat)))
	r.spent = r.spent.add(spent)
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
	r.perCycle = r.spent.per(n)
	r.lat = nil
}
