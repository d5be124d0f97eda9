package remutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// DistElection elects one leader among the candidates that campaign under
// its name, in every process on the same Redis, as etcd's
// concurrency.Election does: Campaign waits until the caller leads and
// publishes its value, Proclaim changes it, Resign ends the term, Leader
// and Observe tell anyone who leads. Create it with Client.NewElection (a
// zero DistElection is not usable); it must not be copied after first use.
//
//   - A term is held by the DistElection value, not by a goroutine (as a
//     NonReentrant DistMutex is): any goroutine may Proclaim or Resign it,
//     and a value leads at most one term at a time. Campaign on a value
//     that leads already publishes its new value (Proclaim), as etcd's
//     does. Candidates are one value each: two values of one name and
//     Client campaign against each other.
//   - Candidates are served in arrival order (the lock's queue), and a
//     Resign hands the term to the next one in the same call, which hears
//     of it in one message: its Campaign returns after one more round trip,
//     which publishes its value.
//   - The term is a lease renewed by the Client's watchdog (WithLease,
//     default 30s): a leader that dies or is cut off from Redis leads until
//     its lease ends, and then the next candidate leads. A term that is lost
//     (the lease could not be renewed in time) ends its Context, and closes
//     Lost, before the lease can end in Redis, so before any other candidate
//     can be elected (see docs/guarantees.md).
//   - Every term has a number, Term: the hold's fencing token, strictly
//     rising from term to term, also across a restart of Redis without
//     persistence (as WithFencing's tokens). Pass it to the storage the
//     leader writes to, so that a leader cut off past its lease cannot
//     write.
//   - A quorum Client (NewQuorumClient) cannot keep the published value in
//     order: NewElection panics on one.
//
// Its keys are P{name}:elect (the leader's hold), P{name}:elect:fence (the
// term counter), P{name}:elect:waiting (the candidates' queue),
// P{name}:elect:leader (the published record) and P{name}:elect:log (a
// stream of records, one per term, of at least the latest 1000 terms) for
// the Client's prefix P: one cluster slot. Changes are published on the channel P{name}:elect:changed.
type DistElection struct {
	_       noCopy
	m       DistMutex // the term's hold: NonReentrant, so it is the value's
	channel string    // where changes are published

	mu      sync.Mutex
	termCtx context.Context // the latest term's context (see Context); nil before the first
}

// Leader is a leader of an election, as it published itself.
type Leader struct {
	Value string // what the leader published (Campaign, Proclaim)
	// Term is the term's number: the leader's fencing token, strictly
	// rising from term to term.
	Term  int64
	Since time.Time // when the term's first value reached Redis, on the Redis server's clock
	Host  string    // the host of the leader's Client
	PID   int       // the process id of the leader's Client
	// Owner is the owner token of the leader's hold (see Holder.Owner): it
	// tells apart two candidates of one process.
	Owner string
}

var (
	// ErrNotLeader is returned by Proclaim on a DistElection that does not
	// lead, or whose term was lost.
	ErrNotLeader = errors.New("remutex: not the leader")
	// ErrNoLeader is returned by Leader when nobody leads the election.
	ErrNoLeader = errors.New("remutex: no leader")
)

// NewElection returns the election called name. It accepts WithLease (how
// long a term outlives a leader that stops renewing it: a crashed process;
// default 30s), and WithFencing and NonReentrant, which an election always
// is. It sends no command. It panics if name is invalid (see CheckName),
// if an option is invalid, if it is WithoutRenewal (a term lasts until it is
// resigned or lost, not for a fixed time) or WithMinHold, or if c is a
// quorum Client.
func (c *Client) NewElection(name string, opts ...MutexOption) *DistElection {
	cfg := c.configure("NewElection", name, opts)
	if cfg.noRenew {
		panic("remutex: NewElection: WithoutRenewal: a term lasts until it is resigned or lost, not for a fixed lease")
	}
	c.refuseQuorum("NewElection", electKind)
	cfg.nonReentrant, cfg.fencing = true, true
	e := &DistElection{}
	e.m.init(c, name, cfg, electKind)
	e.channel = wire.ElectChannel(e.m.spec.Home)
	return e
}

// Name returns the election's name.
func (e *DistElection) Name() string { return e.client().m.Name() }

// client returns e, panicking for a zero DistElection (whose DistMutex
// would name itself instead).
func (e *DistElection) client() *DistElection {
	if e.m.c == nil {
		panic("remutex: DistElection not created by Client.NewElection (a zero DistElection is not usable)")
	}
	return e
}

// Campaign waits until e leads the election, then publishes value as the
// leader's. Candidates are served in arrival order. It returns nil once e
// leads and its value is published; ctx's error (wrapped) if ctx ends
// first, leaving nothing behind (no queue entry, no term); ErrClosed; or a
// permanent Redis error (a key of another type under the election's name
// is a *WrongTypeError). Transient errors are retried until ctx ends. On a
// value that leads already, Campaign is Proclaim.
func (e *DistElection) Campaign(ctx context.Context, value string) error {
	if e.client().m.current() != nil {
		return e.Proclaim(ctx, value)
	}
	for {
		if _, err := e.m.acquire(ctx, false, 1); err != nil {
			return e.wrap("campaign", err)
		}
		h := e.m.current()
		var err error
		if h == nil {
			err = ErrNotLeader // lost already
		} else {
			err = e.publish(ctx, h, value)
		}
		if err == nil {
			e.mu.Lock()
			e.termCtx = e.m.HoldContext(context.Background())
			e.mu.Unlock()
			return nil
		}
		// Not published: the term is given up, so that nobody waits behind
		// a leader that never said so. Within ctx: once it has ended, the
		// release goes on in the background (see UnlockContext), and
		// Campaign returns at its context's end, as it promises.
		_ = e.m.UnlockContext(ctx)
		if !errors.Is(err, ErrNotLeader) || ctx.Err() != nil {
			if ctx.Err() != nil {
				err = ctxErr(ctx, nil)
			}
			return e.wrap("campaign", err)
		}
		// The term was lost between its grant and its publication: campaign
		// again.
	}
}

// Proclaim publishes value as the leader's without an election: Observe
// reports it, Leader returns it. It returns ErrNotLeader (wrapped) if e does
// not lead, or its term was lost; ctx's error if ctx ends first (the value
// may or may not have been published); a permanent Redis error.
func (e *DistElection) Proclaim(ctx context.Context, value string) error {
	h := e.client().m.current()
	if h == nil {
		return e.wrap("proclaim", ErrNotLeader)
	}
	return e.wrap("proclaim", e.publish(ctx, h, value))
}

// publish runs elect.lua's publication of value for the hold h.
func (e *DistElection) publish(ctx context.Context, h *hold, value string) error {
	v, err := e.call(ctx, electPublish, "p", h.owner, strconv.FormatInt(h.fence, 10), value, e.channel)
	if err != nil {
		return err
	}
	if _, ok := v.(string); !ok {
		return ErrNotLeader
	}
	return nil
}

// Resign ends e's term: the next candidate leads at once (it is handed the
// term in the same call). It returns nil if e does not lead (as etcd's
// does), ErrLockLost (wrapped) if its term was lost before, and else
// UnlockContext's errors. The term's Context ends with the cause
// ErrReleased.
func (e *DistElection) Resign(ctx context.Context) error {
	err := e.client().m.UnlockContext(ctx)
	if errors.Is(err, ErrNotHeld) {
		return nil
	}
	return e.wrap("resign", err)
}

// Leader returns the election's leader, as it published itself, or
// ErrNoLeader (wrapped) if nobody leads (a candidate elected but whose value
// is not published yet, for a round trip, does not lead yet). Transient
// errors are retried until ctx ends.
func (e *DistElection) Leader(ctx context.Context) (Leader, error) {
	live, rec, err := e.client().current(ctx)
	switch {
	case err != nil:
		return Leader{}, e.wrap("leader", err)
	case !live:
		return Leader{}, e.wrap("leader", ErrNoLeader)
	}
	return leaderOf(rec), nil
}

// current reads the published record and whether its leader still leads.
func (e *DistElection) current(ctx context.Context) (live bool, rec *wire.LeaderRecord, err error) {
	v, err := e.call(ctx, electScript, "l")
	if err != nil {
		return false, nil, err
	}
	a, ok := v.([]interface{})
	if !ok || len(a) != 2 {
		return false, nil, fmt.Errorf("remutex: unexpected reply of elect.lua: %v", v)
	}
	s, ok := a[1].(string)
	if !ok {
		return false, nil, nil
	}
	r, ok := wire.ParseLeaderRecord(s)
	if !ok {
		return false, nil, &WrongTypeError{Key: e.m.spec.Keys[3], Type: foreignRecord}
	}
	n, _ := a[0].(int64)
	return n == 1, &r, nil
}

func leaderOf(r *wire.LeaderRecord) Leader {
	l := Leader{Value: r.Value, Term: r.ID.Term, Since: time.UnixMilli(r.Since), Owner: r.Owner}
	l.Host, l.PID = wire.OwnerOrigin(r.Owner)
	return l
}

// Context returns a context that ends when e's term ends: when it is lost
// (context.Cause matches ErrLockLost) or resigned (ErrReleased). Before
// the first term it is done already, with the cause ErrNotLeader; after a
// term it is that term's, done, until the next Campaign returns.
func (e *DistElection) Context() context.Context {
	e.client()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.termCtx == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(e.wrap("campaign", ErrNotLeader))
		return ctx
	}
	return e.termCtx
}

// Lost returns a channel that is closed when e's term is lost (its lease
// could not be renewed in time, its key was deleted, the Client closed);
// closed already if e does not lead. A Resign does not close it.
func (e *DistElection) Lost() <-chan struct{} { return e.client().m.Lost() }

// Term returns the number of e's term, its fencing token: 0 if e does not
// lead. A term that was lost keeps its number until Resign (or the next
// Campaign), so that work that goes on after the loss still writes with it,
// and fenced storage refuses it.
func (e *DistElection) Term() int64 { return e.client().m.Fence() }

// Fence is Term, by the name the locks use.
func (e *DistElection) Fence() int64 { return e.Term() }

// call runs elect.lua (sc: electScript, or electPublish for a
// publication) with operation op, retrying transient errors until ctx ends.
func (e *DistElection) call(ctx context.Context, sc *luaScript, op string, args ...interface{}) (interface{}, error) {
	c := e.m.client()
	args = append([]interface{}{op}, args...)
	var bo backoff
	var last error // the transient error being retried
	for {
		if err := ctx.Err(); err != nil {
			return nil, ctxErr(ctx, last)
		}
		if c.isClosed() {
			return nil, ErrClosed
		}
		v, err := c.be.Script(ctx, &e.m.spec.Spec, sc, args...)
		switch {
		case err == nil:
			return v, nil
		case cutOff(ctx, err):
			if last == nil {
				last = errNoReply
			}
			return nil, ctxErr(ctx, last)
		case !transient(err):
			return nil, err
		}
		last = err
		if err := e.m.pause(ctx, &bo, err, op); err != nil {
			return nil, err
		}
	}
}

// wrap wraps err (unless nil) in a *LockError of operation op.
func (e *DistElection) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var le *LockError
	if errors.As(err, &le) && le.Lock == e.m.spec.name {
		err = le.Err // (the engine's, of its own operation)
	}
	return &LockError{Lock: e.m.spec.name, Op: op, Err: err}
}
