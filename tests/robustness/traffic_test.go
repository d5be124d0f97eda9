package robustness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/lockcheck"
)

// Traffic of the robustness test: what the clients do. Each worker is a
// goroutine of one Client that runs sessions on a lock chosen at random:
// take it (Lock, TryLock, or a context form with a random deadline, some
// already past), maybe take it again (nested holds, through either of two
// values of one name with different leases), work for a random time around
// the lease, and unlock as many times (Unlock or UnlockContext). Every call
// is recorded, with what it returned, in the history; every hold with its
// fence, and when its Lost closed.

// robustLocker is one value of a lock, seen the same way whatever its type.
type robustLocker struct {
	res     string // the lock, as the history names it: "mutex m"
	label   string // the value: "m.A"
	name    string // the lock's name, for Inspect
	mode    lockcheck.Mode
	minHold time.Duration
	// ignoreLost makes a fake holder that does not watch Lost (the
	// checker's own test).
	ignoreLost bool

	lock      func()
	lockCtx   func(context.Context) error
	try       func() bool
	tryCtx    func(context.Context) (bool, error)
	unlock    func()
	unlockCtx func(context.Context) error
	lost      func() <-chan struct{}
	fence     func() int64
}

func mutexLocker(res, label string, m *remutex.DistMutex, minHold time.Duration) robustLocker {
	return robustLocker{res: res, label: label, name: m.Name(), mode: lockcheck.Exclusive, minHold: minHold,
		lock: m.Lock, lockCtx: m.LockContext, try: m.TryLock, tryCtx: m.TryLockContext,
		unlock: m.Unlock, unlockCtx: m.UnlockContext, lost: m.Lost, fence: m.Fence}
}

func rwLockers(res string, rw *remutex.DistRWMutex) (w, r robustLocker) {
	w = robustLocker{res: res, label: "rw.W", name: rw.Name(), mode: lockcheck.Exclusive,
		lock: rw.Lock, lockCtx: rw.LockContext, try: rw.TryLock, tryCtx: rw.TryLockContext,
		unlock: rw.Unlock, unlockCtx: rw.UnlockContext, lost: rw.Lost, fence: rw.Fence}
	r = robustLocker{res: res, label: "rw.R", name: rw.Name(), mode: lockcheck.Shared,
		lock: rw.RLock, lockCtx: rw.RLockContext, try: rw.TryRLock, tryCtx: rw.TryRLockContext,
		unlock: rw.RUnlock, unlockCtx: rw.RUnlockContext, lost: rw.Lost, fence: rw.Fence}
	return w, r
}

// robustClient is one Client of the run and the values its workers share.
type robustClient struct {
	idx  int
	c    *remutex.Client
	errs atomic.Int64 // errors its handler heard

	mu      sync.Mutex
	reports []robustReport // what its handler heard, in order

	m      [2]robustLocker // one name, two leases
	mh     robustLocker    // WithMinHold
	rw, rr robustLocker    // write and read side of one DistRWMutex
}

// robustReport is an error the Client's handler heard, and when.
type robustReport struct {
	at  time.Duration
	msg string
}

// who names the Client in the history: "c1".
func (cl *robustClient) who() string { return fmt.Sprintf("c%d", cl.idx) }

// heard records an error its handler heard at at.
func (cl *robustClient) heard(at time.Duration, err error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.reports = append(cl.reports, robustReport{at: at, msg: err.Error()})
}

// reported returns the first error its handler heard in [from, to] that
// starts with prefix, or "".
func (cl *robustClient) reported(from, to time.Duration, prefix string) string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, r := range cl.reports {
		if r.at >= from && r.at <= to && strings.HasPrefix(r.msg, prefix) {
			return r.msg
		}
	}
	return ""
}

// robustEntry is a hold a worker has: the history's record and its count.
type robustEntry struct {
	hold  *lockcheck.Hold
	count int
	lost  <-chan struct{}
	stop  func() // stops the Lost watcher; nil if none
}

// robustWorker is one goroutine of traffic.
type robustWorker struct {
	env *robustEnv
	cl  *robustClient
	who string
	r   *rand.Rand
	nr  robustLocker           // its own NonReentrant value (a value's hold is the worker's)
	sem *remutex.DistSemaphore // its own value: two values of a name are two holders

	stacks map[string][]*robustEntry // per lock, the holds in the order taken
	doing  atomic.Value              // string: the call in progress
}

func newRobustWorker(env *robustEnv, cl *robustClient, i int, seed uint64) *robustWorker {
	cfg := env.cfg
	w := &robustWorker{env: env, cl: cl, who: fmt.Sprintf("c%d/w%d", cl.idx, i),
		r: rand.New(rand.NewPCG(seed, uint64(cl.idx*100+i))), stacks: map[string][]*robustEntry{}}
	w.nr = mutexLocker("mutex nr", "nr", cl.c.NewMutex("nr", remutex.WithLease(cfg.leaseNR), remutex.WithFencing(), remutex.NonReentrant()), 0)
	w.sem = cl.c.NewSemaphore("sem", cfg.semSize, remutex.WithLease(cfg.leaseSem), remutex.WithFencing())
	w.doing.Store("")
	return w
}

// run does sessions until stop closes, then returns holding nothing.
func (w *robustWorker) run(stop <-chan struct{}) {
	for !closedNow(stop) {
		switch x := w.r.IntN(100); {
		case x < 30:
			w.session(stop, w.cl.m[:], 2)
		case x < 42:
			w.session(stop, []robustLocker{w.cl.mh}, 1)
		case x < 54:
			w.session(stop, []robustLocker{w.nr}, 0)
		case x < 66:
			w.session(stop, []robustLocker{w.cl.rw}, 2)
		case x < 80:
			w.session(stop, []robustLocker{w.cl.rr}, 2)
		default:
			w.semSession(stop)
		}
		w.sleep(stop, time.Duration(w.r.Int64N(int64(20*time.Millisecond))))
	}
}

func closedNow(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sleep waits d or until stop closes.
func (w *robustWorker) sleep(stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

// work holds for a while: mostly briefly, sometimes across renewals, now
// and then past the lease.
func (w *robustWorker) work(stop <-chan struct{}) {
	lease := w.env.lease
	var d time.Duration
	switch x := w.r.IntN(10); {
	case x < 6:
		d = time.Duration(w.r.Int64N(int64(20 * time.Millisecond)))
	case x < 9:
		d = time.Duration(w.r.Int64N(int64(lease / 2)))
	default:
		d = lease/2 + time.Duration(w.r.Int64N(int64(lease*3/2)))
	}
	w.sleep(stop, d)
}

// session takes one of ls, nests up to nest more acquisitions through any
// of them, works, and unlocks them all.
func (w *robustWorker) session(stop <-chan struct{}, ls []robustLocker, nest int) {
	pick := func() robustLocker { return ls[w.r.IntN(len(ls))] }
	if !w.acquire(pick()) {
		return
	}
	for i := w.r.IntN(nest + 1); i > 0; i-- {
		if w.r.IntN(3) == 0 {
			w.work(stop)
		}
		w.acquire(pick())
	}
	w.work(stop)
	for len(w.stacks[ls[0].res]) > 0 {
		if w.r.IntN(4) == 0 {
			w.work(stop)
		}
		w.release(pick())
	}
}

// deadline returns a context for a context form: already done, a few
// hundred milliseconds, or a few seconds; and how it was chosen.
func (w *robustWorker) deadline() (context.Context, context.CancelFunc, string) {
	var d time.Duration
	switch x := w.r.IntN(10); {
	case x < 2:
		d = -time.Millisecond
	case x < 7:
		d = time.Millisecond + time.Duration(w.r.Int64N(int64(300*time.Millisecond)))
	default:
		d = 300*time.Millisecond + time.Duration(w.r.Int64N(int64(3*time.Second)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	if d < 0 {
		return ctx, cancel, "expired"
	}
	return ctx, cancel, d.Round(time.Millisecond).String()
}

// call runs f as the call named call, recording its invocation and return,
// and turns a panic into an error (recorded as a violation by the caller's
// outcome check).
func (w *robustWorker) call(call string, f func() error) (invoke, ret time.Duration, err error) {
	w.doing.Store(fmt.Sprintf("%s since %s", call, lockcheck.At(w.env.hist.Now())))
	invoke = w.env.hist.Log(w.who, "%s ...", call)
	func() {
		defer func() {
			if p := recover(); p != nil {
				err = &robustPanic{p}
			}
		}()
		err = f()
	}()
	ret = w.env.hist.Now()
	w.doing.Store("")
	return invoke, ret, err
}

// robustPanic is a panic of a call, as an error.
type robustPanic struct{ v any }

func (p *robustPanic) Error() string { return fmt.Sprintf("panic: %v", p.v) }

// errRefused is what a try that did not take the lock returns here.
var errRefused = errors.New("not taken")

// acquire takes l (or raises the worker's hold of it) by a random form, and
// records the outcome; it reports whether it holds more than before.
func (w *robustWorker) acquire(l robustLocker) bool {
	var call string
	var f func() error
	switch w.r.IntN(4) {
	case 0:
		call = l.label + ".Lock()"
		f = func() error { l.lock(); return nil }
	case 1:
		ctx, cancel, d := w.deadline()
		defer cancel()
		call = l.label + ".LockContext(" + d + ")"
		f = func() error { return l.lockCtx(ctx) }
	case 2:
		call = l.label + ".TryLock()"
		f = func() error {
			if !l.try() {
				return errRefused
			}
			return nil
		}
	default:
		ctx, cancel, d := w.deadline()
		defer cancel()
		call = l.label + ".TryLockContext(" + d + ")"
		f = func() error {
			ok, err := l.tryCtx(ctx)
			if err == nil && !ok {
				err = errRefused
			}
			return err
		}
	}
	invoke, ret, err := w.call(call, f)
	if !w.acquired(call, err) {
		return false
	}
	w.took(l, call, invoke, ret, l.lost(), l.fence(), 0)
	return true
}

// acquired counts and records the outcome of an acquiring call, and
// reports whether it took anything.
func (w *robustWorker) acquired(call string, err error) bool {
	w.env.count(call, err)
	if err == nil {
		return true
	}
	w.env.hist.Log(w.who, "%s -> %v", call, err)
	var p *robustPanic
	if errors.As(err, &p) {
		w.env.hist.Violate("panic", w.who, "%s: %v", call, err)
	}
	return false
}

// took records a successful acquisition: a nested one if it kept the hold
// on top of the worker's stack (the same Lost channel), else a new hold.
func (w *robustWorker) took(l robustLocker, call string, invoke, ret time.Duration, lost <-chan struct{}, fence, permits int64) {
	h := w.env.hist
	st := w.stacks[l.res]
	if n := len(st); n > 0 && st[n-1].lost == lost && l.mode != lockcheck.Permits {
		st[n-1].count++
		h.Log(w.who, "%s -> ok, nested: count %d of %v", call, st[n-1].count, st[n-1].hold)
		return
	}
	gone := closedNow(lost)
	hd := lockcheck.NewHold()
	hd.Res, hd.Who, hd.Client, hd.Mode, hd.Permits = l.res, w.who, w.cl.who(), l.mode, permits
	hd.Fence, hd.MinHold, hd.Invoke, hd.Start = fence, l.minHold, invoke, ret
	hd.Ambiguous, hd.IgnoreLost = gone, l.ignoreLost
	h.AddHold(hd)
	e := &robustEntry{hold: hd, count: 1, lost: lost}
	w.stacks[l.res] = append(st, e)
	h.Log(w.who, "%s -> ok, new %v", call, hd)
	switch {
	case gone:
		h.Lost(hd, ret)
	case !l.ignoreLost:
		e.stop = h.Watch(hd, lost)
	}
	w.probe(l, e, "after "+call)
}

// release unlocks the worker's latest hold of l's lock once, by a random
// form, and records the outcome.
func (w *robustWorker) release(l robustLocker) {
	st := w.stacks[l.res]
	e := st[len(st)-1]
	if e.count == 1 {
		w.probe(l, e, "before the release")
		w.env.hist.Releasing(e.hold)
	}
	var call string
	var f func() error
	if w.r.IntN(2) == 0 {
		call = l.label + ".Unlock()"
		f = func() error { l.unlock(); return nil }
	} else {
		ctx, cancel, d := w.deadline()
		if w.r.IntN(3) == 0 {
			ctx, d = context.Background(), "background"
		}
		defer cancel()
		call = l.label + ".UnlockContext(" + d + ")"
		f = func() error { return l.unlockCtx(ctx) }
	}
	invoke, ret, err := w.call(call, f)
	w.env.count(call, err)
	e.count--
	if e.count == 0 {
		w.stacks[l.res] = st[:len(st)-1]
		if e.stop != nil {
			e.stop()
		}
	}
	w.env.hist.Log(w.who, "%s -> %v (count now %d of hold#%d)", call, errText(err), e.count, e.hold.ID)
	w.checkRelease(call, e, err)
	if e.count > 0 {
		return
	}
	// A final release that failed (its error returned, or an Unlock's told
	// to the handler) is sent again in the background, and if it gets
	// through too late the lock expires by its lease: see releaseFailed.
	// So does one that was on its way when the lease ran out (Lost closed
	// before it returned; a plain Unlock then reports nothing more).
	why := w.cl.reported(invoke, ret, fmt.Sprintf("remutex: unlock %q", l.name))
	if err != nil {
		why = err.Error()
	}
	if why == "" && closedNow(e.lost) {
		why = "Lost closed before the release returned"
	}
	if why != "" {
		w.env.hist.ReleaseFailed(e.hold, why)
	}
}

// checkRelease records a release outcome that cannot be: a panic, or
// ErrNotHeld for a hold the worker has.
func (w *robustWorker) checkRelease(call string, e *robustEntry, err error) {
	var p *robustPanic
	switch {
	case errors.As(err, &p):
		w.env.hist.Violate("panic", w.who, "%s of %v: %v", call, e.hold, err)
	case errors.Is(err, remutex.ErrNotHeld):
		w.env.hist.Violate("outcome", w.who, "%s of %v (count %d) returned %v", call, e.hold, e.count+1, err)
	}
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// semSession takes permits of the worker's semaphore value, works, and
// gives them back.
func (w *robustWorker) semSession(stop <-chan struct{}) {
	l := robustLocker{res: "semaphore sem", label: "sem", name: w.sem.Name(), mode: lockcheck.Permits}
	n := 1 + w.r.Int64N(2)
	if !w.semAcquire(l, n) {
		return
	}
	w.work(stop)
	e := w.stacks[l.res][0]
	w.probe(l, e, "before the release")
	w.env.hist.Releasing(e.hold)
	w.semRelease(e, n)
	w.stacks[l.res] = nil
}

// semAcquire takes n permits by a random form and records the outcome.
func (w *robustWorker) semAcquire(l robustLocker, n int64) bool {
	s := w.sem
	var call string
	var f func() error
	switch w.r.IntN(3) {
	case 0:
		ctx, cancel, d := w.deadline()
		if w.r.IntN(3) == 0 {
			ctx, d = context.Background(), "background"
		}
		defer cancel()
		call = fmt.Sprintf("sem.Acquire(%s, %d)", d, n)
		f = func() error { return s.Acquire(ctx, n) }
	case 1:
		call = fmt.Sprintf("sem.TryAcquire(%d)", n)
		f = func() error {
			if !s.TryAcquire(n) {
				return errRefused
			}
			return nil
		}
	default:
		ctx, cancel, d := w.deadline()
		defer cancel()
		call = fmt.Sprintf("sem.TryAcquireContext(%s, %d)", d, n)
		f = func() error {
			ok, err := s.TryAcquireContext(ctx, n)
			if err == nil && !ok {
				err = errRefused
			}
			return err
		}
	}
	invoke, ret, err := w.call(call, f)
	if !w.acquired(call, err) {
		return false
	}
	w.took(l, call, invoke, ret, s.Lost(), s.Fence(), n)
	return true
}

// semRelease gives back the n permits of e by a random form and records
// the outcome.
func (w *robustWorker) semRelease(e *robustEntry, n int64) {
	s := w.sem
	var call string
	var f func() error
	if w.r.IntN(2) == 0 {
		call = fmt.Sprintf("sem.Release(%d)", n)
		f = func() error { s.Release(n); return nil }
	} else {
		ctx, cancel, d := w.deadline()
		if w.r.IntN(3) == 0 {
			ctx, d = context.Background(), "background"
		}
		defer cancel()
		call = fmt.Sprintf("sem.ReleaseContext(%s, %d)", d, n)
		f = func() error { return s.ReleaseContext(ctx, n) }
	}
	_, _, err := w.call(call, f)
	w.env.count(call, err)
	if e.stop != nil {
		e.stop()
	}
	w.env.hist.Log(w.who, "%s -> %v (hold#%d)", call, errText(err), e.hold.ID)
	w.checkRelease(call, e, err)
}

// probe compares a hold the worker believes in with what Redis holds, read
// through the run's fault-free Client; a difference while the hold's Lost
// stays open (for the grace) is recorded.
func (w *robustWorker) probe(l robustLocker, e *robustEntry, when string) {
	if e.hold.Ambiguous || l.ignoreLost || closedNow(e.lost) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	info, err := w.env.oracle.Inspect(ctx, l.name)
	cancel()
	at := w.env.hist.Now()
	if err != nil {
		return // Redis is down: nothing to compare with
	}
	msg, count := probeMismatch(l, e, info)
	if count != "" {
		w.env.hist.Log(w.who, "probe %s: %s (not checked: counts are absolute)", when, count)
	}
	if msg == "" {
		return
	}
	t := time.NewTimer(w.env.grace)
	defer t.Stop()
	near := false
	select {
	case <-e.lost:
		near = true
	case <-t.C:
	}
	w.env.hist.Probe(lockcheck.Probe{At: at, Hold: e.hold, Msg: when + ": " + msg, Near: near})
}

// probeMismatch says how info differs from the hold e of l: msg for what
// the check fails, count for a hold count that differs (logged only).
func probeMismatch(l robustLocker, e *robustEntry, info remutex.LockInfo) (msg, count string) {
	fence := e.hold.Fence
	if l.mode == lockcheck.Permits {
		var out int64
		for _, h := range info.Holders {
			out += int64(h.Count)
		}
		switch {
		case out < e.hold.Permits:
			return fmt.Sprintf("Redis has %d permits out, the hold has %d", out, e.hold.Permits), ""
		case info.Fence < fence:
			return fmt.Sprintf("Redis's fence counter is %d, below the hold's %d", info.Fence, fence), ""
		}
		return "", ""
	}
	var held []remutex.Holder
	readers := 0
	for _, h := range info.Holders {
		switch {
		case h.Read:
			readers++
		case !h.Kept:
			held = append(held, h)
		}
	}
	if l.mode == lockcheck.Shared {
		switch {
		case len(held) > 0:
			return fmt.Sprintf("Redis has a writer (%s, fence %d) beside this read hold", held[0].Owner, info.Fence), ""
		case readers == 0:
			return "Redis has no reader", ""
		}
		return "", ""
	}
	switch {
	case len(held) == 0:
		return fmt.Sprintf("Redis has no holder (fence counter %d)", info.Fence), ""
	case info.Fence != fence:
		return fmt.Sprintf("Redis handed out fence %d since the hold's %d (holder %s)", info.Fence, fence, held[0].Owner), ""
	case len(held) > 1:
		return fmt.Sprintf("Redis has %d holders", len(held)), ""
	case readers > 0:
		return fmt.Sprintf("Redis has %d readers beside this write hold", readers), ""
	case held[0].Count != e.count:
		return "", fmt.Sprintf("Redis counts %d, the worker %d", held[0].Count, e.count)
	}
	return "", ""
}
