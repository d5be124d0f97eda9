//go:build exp

package remutex

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/redistest"
)

func TestExpGap(t *testing.T) {
	addr := os.Getenv("EXP_ADDR")
	if addr == "" {
		addr = redistest.Start(t).Addr()
	}
	ctx := context.Background()
	clients, per := 4, 2
	if os.Getenv("EXP_SPLIT") != "" {
		clients, per = 2, 1
	}
	var ms []*DistMutex
	var hmu sync.Mutex
	var calls []time.Duration
	hk := &timing{f: func(d time.Duration) { hmu.Lock(); calls = append(calls, d); hmu.Unlock() }}
	for i := 0; i < clients; i++ {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		rdb.AddHook(hk)
		c := NewClient(rdb)
		defer c.Close()
		for j := 0; j < per; j++ {
			ms = append(ms, c.NewMutex("gap"))
		}
	}
	var mu sync.Mutex
	var relAt time.Time
	var gaps, unl []time.Duration
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				if err := m.LockContext(ctx); err != nil {
					t.Error(err)
					return
				}
				got := time.Now()
				mu.Lock()
				if !relAt.IsZero() {
					gaps = append(gaps, got.Sub(relAt))
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				t0 := time.Now()
				mu.Lock()
				relAt = t0
				mu.Unlock()
				m.UnlockContext(ctx)
				d := time.Since(t0)
				mu.Lock()
				unl = append(unl, d)
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	slices.Sort(calls)
	if len(calls) > 0 {
		fmt.Printf("calls n %d p10 %v p50 %v p90 %v\n", len(calls), calls[len(calls)/10], calls[len(calls)/2], calls[len(calls)*9/10])
	}
	slices.Sort(gaps)
	slices.Sort(unl)
	q := func(s []time.Duration, p float64) time.Duration { return s[int(float64(len(s)-1)*p)] }
	fmt.Printf("n %d gap p10 %v p50 %v p90 %v | unlock p10 %v p50 %v p90 %v\n", len(gaps), q(gaps, .1), q(gaps, .5), q(gaps, .9), q(unl, .1), q(unl, .5), q(unl, .9))
}

type timing struct{ f func(time.Duration) }

func (h *timing) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *timing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t0 := time.Now()
		err := next(ctx, cmd)
		if cmd.Name() == "evalsha" {
			h.f(time.Since(t0))
		}
		return err
	}
}
func (h *timing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t0 := time.Now()
		err := next(ctx, cmds)
		h.f(time.Since(t0) + time.Hour)
		return err
	}
}
