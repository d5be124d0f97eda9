package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	remutexotel "github.com/remutex/remutex/otel"
)

// result is what a sale came to.
type result struct {
	sold, locked, gaveUp int
}

// sell stocks the items and lets the buyers at them, spread over
// cfg.clients Clients whose hook is hook; it returns once every buyer is
// done.
func sell(ctx context.Context, addr string, hook *remutexotel.Hook, cfg config) (result, error) {
	rdbs := make([]*redis.Client, cfg.clients)
	clients := make([]*remutex.Client, cfg.clients)
	for i := range clients {
		rdbs[i] = redis.NewClient(&redis.Options{Addr: addr})
		clients[i] = remutex.NewClient(rdbs[i], hook.Option())
	}
	defer func() {
		for i := range clients {
			_ = clients[i].Close()
			_ = rdbs[i].Close()
		}
	}()
	for i := range cfg.items {
		if err := rdbs[0].Set(ctx, stockKey(i), cfg.stock, 0).Err(); err != nil {
			return result{}, err
		}
	}
	var (
		mu   sync.Mutex
		res  result
		errs []error
		wg   sync.WaitGroup
	)
	for b := range cfg.buyers {
		wg.Go(func() {
			r, err := buy(ctx, clients[b%cfg.clients], rdbs[b%cfg.clients], b, cfg)
			mu.Lock()
			defer mu.Unlock()
			res.sold, res.locked, res.gaveUp = res.sold+r.sold, res.locked+r.locked, res.gaveUp+r.gaveUp
			errs = append(errs, err)
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

// buy is one buyer: it tries every item once, starting at its own.
func buy(ctx context.Context, c *remutex.Client, rdb *redis.Client, b int, cfg config) (result, error) {
	var r result
	for k := range cfg.items {
		i := (b + k) % cfg.items
		m := c.NewMutex("sale:item-" + strconv.Itoa(i))
		lctx, cancel := context.WithTimeout(ctx, cfg.patience)
		err := m.LockContext(lctx)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			r.gaveUp++
			continue
		case err != nil:
			return r, err
		}
		r.locked++
		sold, err := take(ctx, rdb, stockKey(i), cfg)
		if uerr := m.UnlockContext(ctx); err == nil {
			err = uerr
		}
		if err != nil {
			return r, err
		}
		if sold {
			r.sold++
		}
	}
	return r, nil
}

// take takes one item off the stock at key, if there is one: a read and a
// write that only the lock keeps from overselling.
func take(ctx context.Context, rdb *redis.Client, key string, cfg config) (bool, error) {
	n, err := rdb.Get(ctx, key).Int()
	if err != nil || n == 0 {
		return false, err
	}
	time.Sleep(cfg.think) // the buyer makes up its mind, holding the lock
	if err := rdb.Set(ctx, key, n-1, 0).Err(); err != nil {
		return false, fmt.Errorf("writing %s: %w", key, err)
	}
	return true, nil
}

func stockKey(i int) string { return "stock:item-" + strconv.Itoa(i) }
