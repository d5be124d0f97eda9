package remutex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/petermattis/goid"
	"github.com/remutex/remutex/internal/wire"
)

// DistOnce is sync.Once across processes: of all the callers of Do with its
// name, in every process on the same Redis, one runs f, and the others wait
// for that run and return when it ends. A successful run is recorded in
// Redis, and every Do after it returns nil without running f. Create it
// with Client.NewOnce (a zero DistOnce is not usable); it must not be
// copied after first use.
//
//   - The run holds a lock of the once's own (P{name}:once, never a
//     DistMutex's of the same name) with a lease that the Client's watchdog
//     renews; f's context ends if that hold is lost. The others wait in the
//     lock's queue, and the run's final release tells them its outcome in
//     one message per Client: each returns with it, and nobody polls.
//   - The run's final release records its outcome in the same script call:
//     a success as the done record P{name}:once:done, kept without expiry
//     (it survives every lease, not a flush of the data set or the loss of
//     an unpersisted server: then the next Do runs f again, so f should be
//     idempotent, e.g. a migration that checks its own version first); a
//     failure as the error record P{name}:once:err, kept OnceErrorKeep (or
//     the lease, if longer) for the run's waiters. Nobody sees the lock free
//     without the outcome of the run that held it.
//   - A failed run (f returned an error or panicked: the panic goes on in
//     the runner, as with sync.Once) is not done: each caller that waited
//     for it returns its error, an *OnceError (wrapped) naming the runner's
//     host and process, and the next Do runs f again. A runner that dies or
//     is cut off leaves no outcome: its lease ends and the longest waiter
//     runs f instead (the lock lets no two run at once while a lease is
//     valid).
//   - Once a value has seen the done record, its Do returns nil with no
//     Redis command, as sync.Once's does; until then Do costs one round
//     trip (two GETs) when the record is there. Concurrent calls of one value wait
//     for one of them, which alone goes to Redis (and its queue), and
//     return with its outcome; one whose context ends returns alone.
//   - Do from f (on the goroutine running f, through the same value)
//     returns ErrRecursiveDo at once, where sync.Once deadlocks. Do of
//     another value of the name, or from a goroutine f waits for, waits for
//     the run that waits for it, as sync.Once does, until its context ends.
//   - A quorum Client (NewQuorumClient) cannot keep "done" exact: NewOnce
//     panics on one.
//
// Its keys are P{name}:once (the runner's hold), P{name}:once:fence,
// P{name}:once:waiting, P{name}:once:done and P{name}:once:err for the
// Client's prefix P: one cluster slot.
type DistOnce struct {
	_    noCopy
	m    DistMutex // the run's hold: NonReentrant, so every Do is a holder of its own
	done atomic.Bool

	mu      sync.Mutex
	running map[int64]bool // goroutines running f (see ErrRecursiveDo)
	flight  *onceFlight    // the Do of this value that goes to Redis; nil if none
	joined  int            // calls waiting for a flight (for tests)
}

// OnceErrorKeep is how long a failed run's error is kept in Redis for the
// callers that waited for it (the once's lease, if that is longer).
const OnceErrorKeep = time.Minute

// ErrRecursiveDo is returned (wrapped) by a Do called from f on the
// goroutine that runs f, through the same DistOnce: sync.Once deadlocks
// there; a DistOnce says so.
var ErrRecursiveDo = errors.New("remutex: Do called from its own f")

// OnceError is the error of a run of a DistOnce that failed, as the callers
// that waited for it see it: the run may have been another process's.
type OnceError struct {
	Once     string        // the once's name
	Owner    string        // the owner token of the run's hold (see Holder.Owner)
	Host     string        // host of the runner's Client; "" if its token does not say
	PID      int           // process id of the runner's Client; 0 if its token does not say
	Started  time.Time     // when f started, on the runner's clock
	Duration time.Duration // how long f ran
	Message  string        // f's error text; "panic: <value>" if f panicked
}

func (e *OnceError) Error() string {
	return fmt.Sprintf("remutex: the run of once %q on host %s, pid %d, failed after %v: %s",
		e.Once, e.Host, e.PID, e.Duration, e.Message)
}

// NewOnce returns the once called name. It accepts WithLease (how long a
// runner that stops renewing keeps the others waiting; default 30s),
// WithoutRenewal (f's context then ends with the fixed lease) and
// WithFencing (each run draws a token: see Fence). It sends no command. It
// panics if name is invalid (see CheckName), if an option is invalid or is
// WithMinHold, or if c is a quorum Client.
func (c *Client) NewOnce(name string, opts ...MutexOption) *DistOnce {
	cfg := c.configure("NewOnce", name, opts)
	c.refuseQuorum("NewOnce", onceKind)
	cfg.nonReentrant = true
	o := &DistOnce{running: map[int64]bool{}}
	o.m.init(c, name, cfg, onceKind)
	return o
}

// Fence returns the fencing token of the run under way through o (call it
// from f, to write with it where a runner cut off past its lease must not
// write): 0 without WithFencing or when o runs nothing.
func (o *DistOnce) Fence() int64 { return o.m.Fence() }

// Name returns the once's name.
func (o *DistOnce) Name() string { return o.m.Name() }

// Do calls f if and only if no run of the once, by any caller anywhere,
// has succeeded, and no other run is under way; else it waits for the run
// under way and returns with it. It returns nil when the once is done
// (by this call's f or any other), f's error (joined with the release's,
// if the hold was lost: the run is then not recorded) when this call ran f,
// an *OnceError (wrapped in a *LockError) when it waited for a run that
// failed, and else the error that ended its wait: ctx's, ErrClosed,
// ErrRecursiveDo, a permanent Redis error (a record key holding foreign
// data is a *WrongTypeError). Transient Redis errors are retried until ctx
// ends. If f panics, the run is not done, its waiters get an *OnceError,
// and the panic goes on.
func (o *DistOnce) Do(ctx context.Context, f func(ctx context.Context) error) error {
	if o.done.Load() {
		return nil
	}
	o.m.client()
	gid := goid.Get()
	for {
		o.mu.Lock()
		if o.running[gid] {
			o.mu.Unlock()
			return o.wrap(ErrRecursiveDo)
		}
		fl := o.flight
		if fl == nil {
			fl = &onceFlight{done: make(chan struct{}), retry: true}
			o.flight = fl
			o.mu.Unlock()
			return o.lead(ctx, f, fl)
		}
		o.joined++
		o.mu.Unlock()
		// Another goroutine of this value is at it: its outcome is this
		// call's too, and Redis sees one waiter per value, not one per call.
		var cerr error
		select {
		case <-fl.done:
		case <-ctx.Done():
			cerr = o.wrap(ctx.Err())
		}
		o.mu.Lock()
		o.joined--
		o.mu.Unlock()
		if cerr != nil {
			return cerr
		}
		if !fl.retry {
			return fl.err
		}
		if o.done.Load() {
			return nil
		}
	}
}

// onceFlight is the Do of a value's goroutine that the value's other
// callers wait for: its outcome, set before done is closed.
type onceFlight struct {
	done  chan struct{}
	err   error // nil: the once is done; else a failed run's *OnceError, wrapped
	retry bool  // the leader gave up for a reason of its own (its ctx, Redis): try again
}

// lead is Do for the goroutine that goes to Redis for its value.
func (o *DistOnce) lead(ctx context.Context, f func(ctx context.Context) error, fl *onceFlight) error {
	defer func() {
		o.mu.Lock()
		o.flight = nil
		o.mu.Unlock()
		close(fl.done)
	}()
	st, err := o.read(ctx)
	if err != nil {
		return err
	}
	if st.done != nil {
		fl.retry = false
		return nil
	}
	// A failed run's error seen now is not this call's: it runs f again
	// after it. One that appears while it waits is its run's.
	seen := st.errRaw
	if done, err := o.wait(ctx, seen, fl); done || err != nil {
		return err
	}
	st, err = o.read(ctx)
	if err == nil && st.done == nil && (st.failed == nil || st.errRaw == seen) {
		return o.run(ctx, f, fl)
	}
	uerr := o.m.UnlockContext(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		return errors.Join(err, uerr)
	case st.done != nil:
		fl.retry = false
		return nil
	}
	fl.err, fl.retry = o.wrap(st.failed), false
	return fl.err
}

// wait takes the once's lock for lead, or ends with the outcome of the run
// it waited for (done true, with Do's error): the outcome its release told
// (see runEnded), or, if the wait's queue entry was found gone without it
// (the message missed), the outcome in Redis, if a run ended since the Do
// read seen; else it waits again.
func (o *DistOnce) wait(ctx context.Context, seen string, fl *onceFlight) (done bool, err error) {
	for {
		err := o.m.LockContext(ctx)
		var re *runEnded
		switch {
		case err == nil:
			return false, nil
		case !errors.As(err, &re):
			return true, err
		case re.outcome != "":
			return true, o.told(re.outcome, fl)
		}
		st, err := o.read(ctx)
		switch {
		case err != nil:
			return true, err
		case st.done != nil:
			fl.retry = false
			return true, nil
		case st.failed != nil && st.errRaw != seen:
			fl.err, fl.retry = o.wrap(st.failed), false
			return true, fl.err
		}
	}
}

// told is Do's outcome for a waiter told the outcome of its run: the run's
// release recorded it (see runEnded).
func (o *DistOnce) told(outcome string, fl *onceFlight) error {
	if outcome == "d" {
		o.done.Store(true)
		fl.retry = false
		return nil
	}
	rec, err := parseOnceRecord(o.m.spec.Keys[4], strings.TrimPrefix(outcome, "e"))
	if err != nil {
		return o.wrap(err)
	}
	fl.err, fl.retry = o.wrap(onceError(rec, o.m.spec.name)), false
	return fl.err
}

// run calls f under the hold Do took, and releases it with f's outcome.
func (o *DistOnce) run(ctx context.Context, f func(ctx context.Context) error, fl *onceFlight) (err error) {
	c := o.m.c
	c.mu.Lock()
	h := o.m.liveLocked(0)
	c.mu.Unlock()
	if h == nil {
		// Lost between the grant and now: nothing ran, nothing to record.
		return o.m.UnlockContext(context.WithoutCancel(ctx))
	}
	owner, _ := h.owner.(string)
	gid := goid.Get()
	o.setRunning(gid, true)
	hctx := o.m.HoldContext(ctx)
	start := time.Now()
	returned := false
	defer func() {
		o.setRunning(gid, false)
		var p interface{}
		if !returned {
			p = recover()
		}
		rec := onceRecord{V: 1, By: owner, Start: start.UnixMilli(), Ms: time.Since(start).Milliseconds()}
		switch {
		case p != nil:
			rec.Err = fmt.Sprintf("panic: %v", p)
		case !returned:
			rec.Err = "f did not return (runtime.Goexit)"
		case err != nil:
			rec.Err = err.Error()
		}
		err = errors.Join(err, o.finish(ctx, h, &rec, fl))
		if p != nil {
			panic(p) // as sync.Once lets it go on
		}
	}()
	err = f(hctx)
	returned = true
	return err
}

func (o *DistOnce) setRunning(gid int64, running bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if running {
		o.running[gid] = true
	} else {
		delete(o.running, gid)
	}
}

// finish releases the run's hold h with the run's record rec, and sets the
// outcome for the value's other callers in fl. It returns the release's
// error.
func (o *DistOnce) finish(ctx context.Context, h *hold, rec *onceRecord, fl *onceFlight) error {
	c := o.m.c
	c.mu.Lock()
	if h.lostErr == nil {
		// (A lost hold records nothing: its release would find it gone,
		// or find a field that outlived the local deadline, and a run
		// whose context ended is no proof of anything.)
		h.outcome = o.outcome(rec)
	}
	c.mu.Unlock()
	uerr := o.m.UnlockContext(context.WithoutCancel(ctx))
	switch {
	case uerr != nil:
		// Lost, or not released (a release posted in the background may
		// still record it): the value's other callers look again.
	case rec.Err != "":
		fl.err, fl.retry = o.wrap(onceError(rec, o.m.spec.name)), false
	default:
		fl.retry = false
		o.done.Store(true)
	}
	return uerr
}

// outcome is once_release.lua's outcome argument for rec.
func (o *DistOnce) outcome(rec *onceRecord) string {
	return rec.Outcome(max(OnceErrorKeep, o.m.spec.Lease).Milliseconds())
}

// Done reports whether a run of the once has succeeded (its done record is
// in Redis), without running anything: no command once this value knows.
func (o *DistOnce) Done(ctx context.Context) (bool, error) {
	if o.done.Load() {
		return true, nil
	}
	st, err := o.read(ctx)
	return st.done != nil, err
}

// Reset deletes the once's records (done, and a failed run's error), for an
// operator who wants f run again: the next Do of a value that has not seen
// the done record runs it. A run under way goes on and records its
// outcome; values (in other processes too) that saw the record already
// keep returning nil from Do until they are made anew, as a sync.Once
// would. Reset of this value forgets what it saw.
func (o *DistOnce) Reset(ctx context.Context) error {
	o.m.client()
	o.done.Store(false)
	_, err := o.call(ctx, "del")
	return err
}

// onceRecord is a once's record in Redis (see wire.OnceRecord).
type onceRecord = wire.OnceRecord

// onceState is what the once's records say.
type onceState struct {
	done   *onceRecord
	failed *OnceError // the latest failed run's, while it is kept
	errRaw string     // the error record as stored, to tell runs apart
}

// read reads the once's records, retrying transient errors until ctx ends.
// It records a done record it finds in o.
func (o *DistOnce) read(ctx context.Context) (onceState, error) {
	var bo backoff
	for {
		v, err := o.call(ctx, "get")
		switch {
		case err == nil:
			st, err := o.parse(v)
			if err != nil {
				return st, o.wrap(err)
			}
			if st.done != nil {
				o.done.Store(true)
			}
			return st, nil
		case cutOff(ctx, err):
			return onceState{}, o.wrap(ctxErr(ctx, err))
		case !transient(err):
			return onceState{}, o.wrap(err)
		}
		if err := o.m.pause(ctx, &bo, err, "once"); err != nil {
			return onceState{}, o.wrap(err)
		}
	}
}

// call runs once.lua with op ("get" or "del"); "get" is two GETs in one
// round trip instead, and once.lua only if one of them fails with a reply
// error (a record key of another type: its error names the key). A Do
// that finds the record is what a once does most, and a script call costs
// redis-server several times what a GET does. (The two GETs are not one
// atomic read, and need not be: under the lock no run writes a record; and
// before it, a Do that reads around the end of a run sees either the run's
// outcome, or no outcome, as if it came just after, and then waits for the
// lock and reads again.)
func (o *DistOnce) call(ctx context.Context, op string) (interface{}, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.m.c.isClosed() {
		return nil, ErrClosed
	}
	be := o.m.c.be
	if op != "get" {
		return be.Script(ctx, &o.m.spec.Spec, onceScript, op)
	}
	keys := o.m.spec.KeyArgs
	rec, err := be.Get(ctx, keys[3], keys[4])
	if isReply(err) {
		return be.Script(ctx, &o.m.spec.Spec, onceScript, op)
	}
	return rec, err
}

func (o *DistOnce) parse(v interface{}) (onceState, error) {
	var st onceState
	a, ok := v.([]interface{})
	if !ok || len(a) != 2 {
		return st, fmt.Errorf("remutex: unexpected reply of once.lua: %v", v)
	}
	keys := o.m.spec.Keys
	if s, ok := a[0].(string); ok {
		rec, err := parseOnceRecord(keys[3], s)
		if err != nil {
			return st, err
		}
		st.done = rec
	}
	if s, ok := a[1].(string); ok {
		rec, err := parseOnceRecord(keys[4], s)
		if err != nil {
			return st, err
		}
		st.errRaw = s
		st.failed = onceError(rec, o.m.spec.name)
	}
	return st, nil
}

// parseOnceRecord decodes the record s stored under key; anything that is
// not one is foreign data, a *WrongTypeError.
func parseOnceRecord(key, s string) (*onceRecord, error) {
	rec, ok := wire.ParseOnceRecord(s)
	if !ok {
		return nil, &WrongTypeError{Key: key, Type: foreignRecord}
	}
	return rec, nil
}

func onceError(r *onceRecord, name string) *OnceError {
	e := &OnceError{Once: name, Owner: r.By, Started: time.UnixMilli(r.Start), Duration: time.Duration(r.Ms) * time.Millisecond, Message: r.Err}
	e.Host, e.PID = wire.OwnerOrigin(r.By)
	return e
}

func (o *DistOnce) wrap(err error) error {
	var le *LockError
	if errors.As(err, &le) {
		return err
	}
	return &LockError{Lock: o.m.spec.name, Op: "once", Err: err}
}

// OnceInfo is what Inspect tells of a once.
type OnceInfo struct {
	Name string
	Done bool
	// Run is the successful run that made it done: who ran it, when, how
	// long (Message empty); nil if not done.
	Run *OnceError
	// Failed is the latest failed run, while its error is kept
	// (OnceErrorKeep); nil if none.
	Failed *OnceError
	// Lock is the once's lock, as Client.Inspect reports it: Holders is the
	// runner now (none if nobody runs f), Waiters those who wait for it.
	Lock LockInfo
}

// Inspect reports the once's state: done or not, who ran it, when and how
// long, the latest failed run, who runs it now and who waits. It uses
// Client.Inspect for the lock, so it fails as that does.
func (o *DistOnce) Inspect(ctx context.Context) (OnceInfo, error) {
	o.m.client()
	info := OnceInfo{Name: o.m.spec.name}
	v, err := o.call(ctx, "get")
	if err != nil {
		return info, o.wrap(err)
	}
	st, err := o.parse(v)
	if err != nil {
		return info, o.wrap(err)
	}
	if st.done != nil {
		info.Done, info.Run = true, onceError(st.done, info.Name)
	}
	info.Failed = st.failed
	li, err := o.m.c.Inspect(ctx, info.Name)
	if err != nil {
		return info, err
	}
	info.Lock = LockInfo{Name: info.Name, Key: o.m.spec.Keys[0]}
	for _, l := range append([]LockInfo{li}, li.Others...) {
		if l.Kind == "once" {
			l.Others = nil
			info.Lock = l
		}
	}
	return info, nil
}
