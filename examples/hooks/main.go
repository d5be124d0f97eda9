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
// Each line names its duration for what it measures (took, waited, held,
// round_trip), and the lines come in the order the lock changed hands: a
// holder's "released" always before the next holder's "acquired", although
// the next holder's hook may run first (see holdOrder).
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
	lost chan struct{} // a token for each EventLost counted (up to its capacity)
}

// newMetrics returns counters that are not yet published, so that tests can
// make many.
func newMetrics() *metrics {
	return &metrics{vars: new(expvar.Map).Init(), lost: make(chan struct{}, 1)}
}

// hook returns the function for WithHook: it counts ev and logs it, in the
// order the lock changed hands (see holdOrder).
func (m *metrics) hook(log *slog.Logger) func(remutex.Event) {
	order := newHoldOrder(func(ev remutex.Event) { logEvent(log, ev) })
	return func(ev remutex.Event) {
		m.count(ev)
		order.pass(ev)
	}
}

// count counts ev by kind and adds up the duration it carries.
func (m *metrics) count(ev remutex.Event) {
	m.vars.Add(ev.Kind.String(), 1)
	switch ev.Kind {
	case remutex.EventAcquired:
		m.vars.AddFloat("acquire_seconds", ev.Duration.Seconds())
	case remutex.EventWaited:
		m.vars.AddFloat("wait_seconds", ev.Duration.Seconds())
		if ev.Err != nil {
			m.vars.Add("waited_gave_up", 1)
		}
	case remutex.EventReleased, remutex.EventLost:
		m.vars.AddFloat("held_seconds", ev.Duration.Seconds())
		if ev.Kind == remutex.EventLost {
			select {
			case m.lost <- struct{}{}:
			default:
			}
		}
	case remutex.EventRenewed:
		m.vars.AddFloat("renew_seconds", ev.Duration.Seconds())
	}
}

// logEvent writes one line for ev: Warn for a Lock that gave up waiting and
// for a lost hold, Info for the rest. The duration is named for what it
// measures: the time a Lock took, waited, or held the lock, or a renewal's
// round trip.
func logEvent(log *slog.Logger, ev remutex.Event) {
	level := slog.LevelInfo
	if ev.Err != nil || ev.Kind == remutex.EventLost {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("lock", ev.Lock),
		slog.String("owner", shortOwner(ev.Owner)),
		slog.Duration(durationKey[ev.Kind], ev.Duration.Round(time.Microsecond)),
	}
	if ev.Fence != 0 {
		attrs = append(attrs, slog.Int64("fence", ev.Fence))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("err", ev.Err.Error()))
	}
	log.LogAttrs(context.Background(), level, "remutex "+ev.Kind.String(), attrs...)
}

// durationKey names the duration each kind of event carries.
var durationKey = map[remutex.EventKind]string{
	remutex.EventAcquired:    "took",       // from the Lock call until it held the lock
	remutex.EventWaiting:     "after",      // from the Lock call until it found the lock busy
	remutex.EventWaited:      "waited",     // from the Lock call until it held the lock or gave up
	remutex.EventReleased:    "held",       // from acquiring to releasing
	remutex.EventLost:        "held",       // from acquiring to the loss
	remutex.EventRenewed:     "round_trip", // of the renewal
	remutex.EventRenewFailed: "round_trip", // of the renewal that failed
}

// holdOrder passes a Client's events on in the order the lock changed hands.
//
// The hook runs after the fact, on the goroutine where the event happened:
// once an Unlock has released the lock in Redis, the next holder may take it
// and report "acquired" before the Unlock returns and reports "released".
// Logged as they come, the two lines would read as if both held the lock at
// once. holdOrder holds a new holder's events back until the previous
// holder's "released" (or "lost") has been passed on. That is never long:
// every hold of a Client ends with one of the two, reported as soon as its
// Unlock returns (or Close, for the holds it ends). A Lock that begins to
// wait, or gave up waiting, does not hold the lock, and is passed on at once.
type holdOrder struct {
	mu      sync.Mutex
	next    func(remutex.Event)
	holder  map[string]string          // lock -> the owner whose "acquired" was passed on, until its hold ends
	waiting map[string][]remutex.Event // lock -> events held back until then
}

func newHoldOrder(next func(remutex.Event)) *holdOrder {
	return &holdOrder{next: next, holder: map[string]string{}, waiting: map[string][]remutex.Event{}}
}

func (o *holdOrder) pass(ev remutex.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passLocked(ev)
}

func (o *holdOrder) passLocked(ev remutex.Event) {
	now := ev.Kind == remutex.EventWaiting || ev.Kind == remutex.EventWaited && ev.Err != nil
	if h := o.holder[ev.Lock]; h != "" && h != ev.Owner && !now {
		o.waiting[ev.Lock] = append(o.waiting[ev.Lock], ev)
		return
	}
	o.next(ev)
	switch ev.Kind {
	case remutex.EventAcquired:
		o.holder[ev.Lock] = ev.Owner
	case remutex.EventReleased, remutex.EventLost:
		delete(o.holder, ev.Lock)
		held := o.waiting[ev.Lock]
		delete(o.waiting, ev.Lock)
		for _, e := range held { // in the order they came; some may wait again
			o.passLocked(e)
		}
	}
}

// shortOwner shortens an owner token <client id>:<goroutine id>.<n> for logs:
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

	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb,
		remutex.WithHook(m.hook(newLogger(out))),
		remutex.WithLogger(slog.New(slog.DiscardHandler)), // the hook logs losses already
	)
	defer locks.Close() // before rdb.Close: deferred calls run last in, first out

	var id [4]byte
	_, _ = rand.Read(id[:])
	name := "report:" + hex.EncodeToString(id[:])
	key := remutex.DefaultKeyPrefix + "{" + name + "}"
	defer rdb.Del(context.WithoutCancel(ctx), key, key+":fence")
	mutex := func() *remutex.DistMutex {
		return locks.NewMutex(name, remutex.WithLease(lease), remutex.WithFencing())
	}

	fmt.Fprintln(out, "-- two goroutines contend; the first holds the lock for one lease")
	if err := contend(ctx, mutex, lease); err != nil {
		return err
	}
	fmt.Fprintln(out, "-- a LockContext with a 100ms timeout finds the lock held")
	if err := giveUp(ctx, mutex, 100*time.Millisecond); err != nil {
		return err
	}
	fmt.Fprintln(out, "-- the lock's key is deleted behind its holder's back")
	if err := lose(ctx, mutex(), rdb, key, m.lost); err != nil {
		return err
	}
	fmt.Fprintf(out, "-- expvar (/debug/vars) \"remutex\": %s\n", m.vars.String())
	return verdict(out, m)
}

// verdict checks that the counters add up, as a hook's user relies on:
// every hold ended released or lost, every wait ended, and one hold was lost.
func verdict(out io.Writer, m *metrics) error {
	n := func(name string) int64 {
		if v, ok := m.vars.Get(name).(*expvar.Int); ok {
			return v.Value()
		}
		return 0
	}
	acquired, ended, lost := n("acquired"), n("released")+n("lost"), n("lost")
	if acquired != ended || n("waiting") != n("waited") || lost != 1 {
		fmt.Fprintf(out, "verdict: FAIL: %d acquired, %d released or lost (%d lost), %d waits begun, %d ended\n",
			acquired, ended, lost, n("waiting"), n("waited"))
		return errors.New("the events do not add up")
	}
	fmt.Fprintf(out, "verdict: ok: each of the %d holds ended released or lost (%d lost), each of the %d waits ended\n",
		acquired, lost, n("waited"))
	return nil
}

// newLogger returns a text logger to out that leaves out the time, so that
// runs compare.
func newLogger(out io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

// contend has two goroutines take the lock: the first holds it for hold,
// renewed meanwhile (acquired, renewed, released); the second waits for it
// (acquired, waited, released).
func contend(ctx context.Context, mutex func() *remutex.DistMutex, hold time.Duration) error {
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
		time.Sleep(hold)
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
	return nil
}

// giveUp has a LockContext with a timeout find the lock held by another
// goroutine (waited, with an error).
func giveUp(ctx context.Context, mutex func() *remutex.DistMutex, timeout time.Duration) error {
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
	tctx, tcancel := context.WithTimeout(ctx, timeout)
	err := mutex().LockContext(tctx)
	tcancel()
	close(release)
	if !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("LockContext on a held lock: got %v, want a deadline error", err)
	}
	return <-done
}

// lose takes m and deletes its key in Redis behind its back: the next
// renewal finds it gone (lost), and Unlock reports ErrLockLost. It returns
// once the hook has counted the loss (a token on hooked): the hook runs on the
// watchdog's goroutine after Lost's channel is closed, so the channel alone
// does not say the counters are final.
func lose(ctx context.Context, m *remutex.DistMutex, rdb *redis.Client, key string, hooked <-chan struct{}) error {
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	lost := m.Lost()
	if err := rdb.Del(ctx, key).Err(); err != nil {
		return err
	}
	select {
	case <-lost:
	case <-ctx.Done():
		return errors.New("the hold was not reported lost")
	}
	if err := m.UnlockContext(ctx); !errors.Is(err, remutex.ErrLockLost) {
		return fmt.Errorf("unlock of a lost hold: got %v, want ErrLockLost", err)
	}
	select {
	case <-hooked:
		return nil
	case <-ctx.Done():
		return errors.New("the hook was not told of the loss")
	}
}
