package remutex

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// BenchmarkOnceDo is a Do of a once that is done: "found" by a value that
// has not seen the record yet (one round trip: two GETs), "known"
// by a value that has (no round trip). Set "found" beside
// BenchmarkLockUnlock's uncontended cycle.
func BenchmarkOnceDo(b *testing.B) {
	addr := benchAddr(b)
	var cnt rttCounter
	c := clientOn(b, benchRDB(b, addr, &cnt))
	name := benchName(b)
	ctx := context.Background()
	f := func(context.Context) error { return nil }
	if err := c.NewOnce(name).Do(ctx, f); err != nil {
		b.Fatal(err)
	}
	b.Run("found", func(b *testing.B) {
		onces := make([]*DistOnce, b.N)
		for i := range onces {
			onces[i] = c.NewOnce(name)
		}
		b.ReportAllocs()
		cnt.reset()
		b.ResetTimer()
		for _, o := range onces {
			if err := o.Do(ctx, f); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
	})
	b.Run("known", func(b *testing.B) {
		o := c.NewOnce(name)
		if err := o.Do(ctx, f); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		cnt.reset()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := o.Do(ctx, f); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(cnt.rtt.Load())/float64(b.N), "rtt/op")
	})
}

// BenchmarkOnceRace is 16 callers on 4 Clients calling Do of a fresh once at
// once, per op: one runs f (1ms), the others wait; gap-p50-ms and
// gap-p99-ms are how long after f returned the waiters' Do returned (the
// run's final release, one round trip, and its message to the waiters),
// beside release-p50-ms, how long after f returned the runner's Do
// returned (the release's round trip), and ping-p50-ms, the median round
// trip of a PING on the same server, one after the other.
func BenchmarkOnceRace(b *testing.B) {
	const clients, perClient = 4, 4
	addr := benchAddr(b)
	cs := make([]*Client, clients)
	rdbs := make([]*redis.Client, clients)
	for i := range cs {
		rdbs[i] = benchRDB(b, addr, nil)
		cs[i] = clientOn(b, rdbs[i])
	}
	ctx := context.Background()
	pings := make([]time.Duration, 0, 200)
	for range cap(pings) {
		t0 := time.Now()
		if err := rdbs[0].Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		pings = append(pings, time.Since(t0))
	}
	slices.Sort(pings)
	var gaps, releases []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := benchName(b)
		var (
			mu      sync.Mutex
			ended   time.Time
			ranBack time.Time // when the runner's Do returned
			runs    int
			backs   []time.Time
			wg      sync.WaitGroup
		)
		for _, c := range cs {
			o := c.NewOnce(name)
			for range perClient {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ran := false
					err := o.Do(ctx, func(context.Context) error {
						time.Sleep(time.Millisecond)
						mu.Lock()
						runs++
						ended = time.Now()
						mu.Unlock()
						ran = true
						return nil
					})
					now := time.Now()
					if err != nil {
						b.Error(err)
					}
					mu.Lock()
					if ran {
						ranBack = now
					} else {
						backs = append(backs, now)
					}
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		if runs != 1 {
			b.Fatalf("runs of f: got %d, want 1", runs)
		}
		for _, t := range backs {
			gaps = append(gaps, t.Sub(ended))
		}
		releases = append(releases, ranBack.Sub(ended))
	}
	b.StopTimer()
	slices.Sort(gaps)
	slices.Sort(releases)
	if len(gaps) > 0 {
		b.ReportMetric(float64(releases[len(releases)/2].Microseconds())/1000, "release-p50-ms")
		b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds())/1000, "gap-p50-ms")
		b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds())/1000, "gap-p99-ms")
	}
	b.ReportMetric(float64(pings[len(pings)/2].Microseconds())/1000, "ping-p50-ms")
}
