package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// process is one Client standing for a process: its connection pool, its
// remutex Client, and the lock (nil in the pass without one).
type process struct {
	rdb  *redis.Client
	c    *remutex.Client
	lock *remutex.DistRWMutex
}

func connect(addr, name string, locked bool) *process {
	p := &process{rdb: redis.NewClient(&redis.Options{Addr: addr})}
	p.c = remutex.NewClient(p.rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
	if locked {
		p.lock = p.c.NewRWMutex(name)
	}
	return p
}

func (p *process) close() {
	_ = p.c.Close()
	_ = p.rdb.Close()
}

// pass runs the readers and the writer once, with a DistRWMutex or without.
func pass(ctx context.Context, cfg config, addr string, locked bool) (*outcome, error) {
	key := fmt.Sprintf("config:%d", time.Now().UnixNano())
	writer := connect(addr, key, locked)
	defer writer.close()
	if err := writer.rdb.HSet(ctx, key, "version", 0, "a", "v0", "b", "v0").Err(); err != nil {
		return nil, err
	}
	defer writer.rdb.Del(ctx, key)
	var out outcome
	var inside atomic.Int64
	var done atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.clients {
		p := connect(addr, key, locked)
		defer p.close()
		for range cfg.readers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.readUntil(ctx, key, &done, &inside, &out)
			}()
		}
	}
	err := writer.rewrite(ctx, key, cfg, &out)
	done.Store(true)
	wg.Wait()
	out.took = time.Since(start)
	return &out, err
}

// rewrite writes the configuration cfg.writes times, field by field.
func (p *process) rewrite(ctx context.Context, key string, cfg config, out *outcome) error {
	for v := 1; v <= cfg.writes; v++ {
		if p.lock != nil {
			t0 := time.Now()
			p.lock.Lock()
			out.writerWaits = append(out.writerWaits, time.Since(t0))
		}
		val := "v" + strconv.Itoa(v)
		for _, f := range [][2]string{{"version", strconv.Itoa(v)}, {"a", val}, {"b", val}} {
			if err := p.rdb.HSet(ctx, key, f[0], f[1]).Err(); err != nil {
				return err
			}
			time.Sleep(cfg.gap)
		}
		if p.lock != nil {
			p.lock.Unlock()
		}
		time.Sleep(cfg.every)
	}
	return nil
}

// readUntil reads the configuration until done, counting torn reads.
func (p *process) readUntil(ctx context.Context, key string, done *atomic.Bool, inside *atomic.Int64, out *outcome) {
	for !done.Load() {
		if p.lock != nil {
			p.lock.RLock()
		}
		n := inside.Add(1)
		for m := atomic.LoadInt64(&out.maxInside); n > m && !atomic.CompareAndSwapInt64(&out.maxInside, m, n); m = atomic.LoadInt64(&out.maxInside) {
		}
		cur, err := p.rdb.HGetAll(ctx, key).Result()
		inside.Add(-1)
		if p.lock != nil {
			p.lock.RUnlock()
		}
		if err != nil {
			continue
		}
		atomic.AddInt64(&out.reads, 1)
		if want := "v" + cur["version"]; cur["a"] != want || cur["b"] != want {
			atomic.AddInt64(&out.torn, 1)
		}
	}
}
