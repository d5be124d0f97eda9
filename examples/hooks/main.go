// Command hooks feeds a remutex Client's events to expvar counters and to
// log/slog, through WithHook: metrics and logs without remutex depending on a
// library for either.
//
// The hook counts every event by kind in an expvar.Map (what /debug/vars
// serves, under "remutex"), adds up the durations the events carry (time to
// acquire, time waited, time held, renewal round trips), and writes one slog
// line per event: Info for acquired, waited, released and renewed, Warn for a
// Lock that gave up waiting and for a lost hold. The hook runs synchronously
// where the event happens (the goroutine that locks or unlocks, the watchdog
// for renewals and most losses), so it only does quick, non-blocking work:
// expvar updates are atomic, and the slog handler writes one short line.
//
// The run makes every kind of event happen: two goroutines contend for the
// lock (acquired, waited, released), the holder keeps it past a few renewals
// (renewed), a LockContext gives up after its timeout (waited, with an
// error), and the lock's key is deleted behind a holder's back (lost).
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/hooks
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"expvar"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

func main() {
	m := newMetrics()
	// A program publishes its counters once; /debug/vars (net/http/pprof's
	// neighbour, served by expvar.Handler) then shows them under "remutex".
	expvar.Publish("remutex", m.vars)
	if err := run(context.Background(), os.Stdout, os.Getenv("REDIS_ADDR"), m); err != nil {
		fmt.Fprintln(os.Stderr, "hooks:", err)
		os.Exit(1)
	}
}

// metrics are the counters the hook feeds.
type metrics struct {
	vars *expvar.Map
}

// newMetrics returns counters that are not yet published, so that tests can
// make many.
func newMetrics() *metrics {
	return &metrics{vars: new(expvar.Map).Init()}
}

// hook returns the function for WithHook: it counts ev and logs it.
func (m *metrics) hook(log *slog.Logger) func(remutex.Event) {
	return func(ev remutex.Event) {
		kind := ev.Kind.String()
		m.vars.Add(kind, 1)
		level := slog.LevelInfo
		switch ev.Kind {
		case remutex.EventAcquired:
			m.vars.AddFloat("acquire_seconds", ev.Duration.Seconds())
		case remutex.EventWaited:
			m.vars.AddFloat("wait_seconds", ev.Duration.Seconds())
			if ev.Err != nil {
				m.vars.Add("waited_gave_up", 1)
				level = slog.LevelWarn
			}
		case remutex.EventReleased:
			m.vars.AddFloat("held_seconds", ev.Duration.Seconds())
		case remutex.EventRenewed:
			m.vars.AddFloat("renew_seconds", ev.Duration.Seconds())
		case remutex.EventLost:
			m.vars.AddFloat("held_seconds", ev.Duration.Seconds())
			level = slog.LevelWarn
		}
		attrs := []slog.Attr{
			slog.String("lock", ev.Lock),
			slog.String("owner", shortOwner(ev.Owner)),
			slog.Duration("duration", ev.Duration.Round(time.Microsecond)),
		}
		if ev.Fence != 0 {
			attrs = append(attrs, slog.Int64("fence", ev.Fence))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.String("err", ev.Err.Error()))
		}
		log.LogAttrs(context.Background(), level, "remutex "+kind, attrs...)
	}
}

// shortOwner shortens an owner token <client id>:<goroutine id> for logs:
// the first 8 hex digits of the client id identify it well enough.
func shortOwner(owner string) string {
	id, g, ok := strings.Cut(owner, ":")
	if !ok || len(id) <= 8 {
		return owner
	}
	return id[:8] + ":" + g
}

// lockedWriter serialises writes: the hook logs from several goroutines,
// and run prints between them.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// run makes every kind of event happen on the Redis at addr (an embedded
// miniredis if empty), logging them to out and counting them in m.
func run(ctx context.Context, w io.Writer, addr string, m *metrics) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out := &lockedWriter{w: w}
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	const lease = 300 * time.Millisecond
	fmt.Fprintf(out, "hooks: WithHook feeds expvar counters and slog lines; lease %v, renewed at least every %v\n", lease, lease/3)
	fmt.Fprintf(out, "redis: %s\n", where)

	// The log lines leave out the time, so that runs compare.
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb,
		remutex.WithHook(m.hook(log)),
		remutex.WithLogger(slog.New(slog.DiscardHandler)), // the hook logs losses already
	)
	defer locks.Close() // before rdb.Close: deferred calls run last in, first out

	var id [4]byte
	_, _ = rand.Read(id[:])
	name := "report:" + hex.EncodeToString(id[:])
	defer rdb.Del(context.WithoutCancel(ctx), remutex.DefaultKeyPrefix+"{"+name+"}", remutex.DefaultKeyPrefix+"{"+name+"}:fence")
	mutex := func() *remutex.DistMutex {
		return locks.NewMutex(name, remutex.WithLease(lease), remutex.WithFencing())
	}

	// 1. Contention: the first goroutine holds the lock past a few renewals;
	// the second waits for it.
	fmt.Fprintln(out, "-- two goroutines contend; the first holds the lock for one lease")
	var wg sync.WaitGroup
	held := make(chan struct{})
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		m1 := mutex()
		if err := m1.LockContext(ctx); err != nil {
			errs <- err
			close(held)
			return
		}
		close(held)
		time.Sleep(lease) // renewed meanwhile
		errs <- m1.UnlockContext(ctx)
	}()
	go func() {
		defer wg.Done()
		<-held
		m2 := mutex()
		if err := m2.LockContext(ctx); err != nil {
			errs <- err
			return
		}
		errs <- m2.UnlockContext(ctx)
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}

	// 2. A LockContext that gives up: another goroutine holds the lock.
	fmt.Fprintln(out, "-- a LockContext with a 100ms timeout finds the lock held")
	holding, release, done := make(chan error, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		m3 := mutex()
		if err := m3.LockContext(ctx); err != nil {
			holding <- err
			return
		}
		holding <- nil
		<-release
		done <- m3.UnlockContext(ctx)
	}()
	if err := <-holding; err != nil {
		return err
	}
	tctx, tcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := mutex().LockContext(tctx)
	tcancel()
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("LockContext on a held lock: got %v, want a deadline error", err)
	}
	if err := <-done; err != nil {
		return err
	}

	// 3. A lost hold: the key is deleted behind the holder's back; the next
	// renewal finds it gone.
	fmt.Fprintln(out, "-- the lock's key is deleted behind its holder's back")
	m4 := mutex()
	if err := m4.LockContext(ctx); err != nil {
		return err
	}
	lost := m4.Lost()
	if err := rdb.Del(ctx, remutex.DefaultKeyPrefix+"{"+name+"}").Err(); err != nil {
		return err
	}
	select {
	case <-lost:
	case <-ctx.Done():
		return errors.New("the hold was not reported lost")
	}
	if err := m4.UnlockContext(ctx); !errors.Is(err, remutex.ErrLockLost) {
		return fmt.Errorf("unlock of a lost hold: got %v, want ErrLockLost", err)
	}

	fmt.Fprintf(out, "-- expvar (/debug/vars) \"remutex\": %s\n", m.vars.String())
	return nil
}
