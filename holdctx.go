package remutex

import (
	"context"
	"errors"
)

// Contexts of holds. Lost answers for the calling goroutine's hold, so it
// cannot be asked from a goroutine that the holder started: that goroutine
// holds nothing, and its Lost is closed at once. A hold's context is made by
// the holder and may be used anywhere: hand it to the goroutines that work
// under the lock (an errgroup, a worker pool, a streaming response) and they
// stop when the hold is lost, or once it is released.

// ErrReleased is the cause (context.Cause) of a hold's context that ended
// because the hold was released by its final Unlock. A context that ended
// because the hold was lost has a cause matching ErrLockLost.
var ErrReleased = errors.New("remutex: hold released")

// HoldContext returns a context derived from parent that is done when the
// calling goroutine's hold of m ends: when it is lost (context.Cause matches
// ErrLockLost, the *LockError names the lock), when its final Unlock
// releases it (ErrReleased), or when parent is done. Call it from the
// goroutine that holds m; the context may be used from any goroutine. If
// the goroutine holds nothing, the context is done already, with the cause
// ErrNotHeld. A hold keeps its contexts until it ends.
func (m *DistMutex) HoldContext(parent context.Context) context.Context {
	return m.client().holdContext(parent, func() *hold { return m.liveLocked(m.gid()) }, m.wrapOp("lock", ErrNotHeld))
}

// The one implementation of every kind's Lost, Fence and HoldContext: each
// public type says which of its holds they answer for, by a function that
// finds it with c.mu held (the goroutine's, a DistRWMutex's write hold
// before its read hold, a semaphore's latest acquisition).

// lostOf returns the loss channel of the hold find returns, closed already
// when there is none.
func (c *Client) lostOf(find func() *hold) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := find(); h != nil {
		return h.lostChanLocked()
	}
	return closedChan
}

// fenceOf returns the fencing token of the first hold that one of finds
// returns, in order, or 0.
func (c *Client) fenceOf(finds ...func() *hold) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, find := range finds {
		if h := find(); h != nil {
			return h.fence
		}
	}
	return 0
}

// holdContext returns a context derived from parent that ends with the
// hold find returns, or at once, with the cause notHeld, if there is none.
func (c *Client) holdContext(parent context.Context, find func() *hold, notHeld error) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	c.attach(find, cancel, notHeld)
	return ctx
}

// attach gives the hold find returns a context to end with it (cancel), or
// ends it at once with the cause notHeld if there is none.
func (c *Client) attach(find func() *hold, cancel context.CancelCauseFunc, notHeld error) {
	c.mu.Lock()
	h := find()
	if h != nil {
		h.ctxs = append(h.ctxs, cancel)
	}
	c.mu.Unlock()
	if h == nil {
		cancel(notHeld)
	}
}

// takeContextsLocked hands over the hold's contexts, to be ended once c.mu
// is released.
func (h *hold) takeContextsLocked() []context.CancelCauseFunc {
	ctxs := h.ctxs
	h.ctxs = nil
	return ctxs
}

// Do runs f under m: it locks m with LockContext(ctx), calls f with the
// hold's context (see HoldContext: it ends when the hold is lost or ctx
// ends), and unlocks m when f returns, also when f panics (the panic goes
// on). It returns LockContext's error without calling f, else f's error
// joined with Unlock's: errors.Is(err, ErrLockLost) says that the hold was
// lost before f finished. The unlock is not cut short by ctx: it is bounded
// as Unlock is.
func (m *DistMutex) Do(ctx context.Context, f func(ctx context.Context) error) (err error) {
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	hctx := m.HoldContext(ctx)
	defer func() {
		err = errors.Join(err, m.UnlockContext(context.WithoutCancel(ctx)))
	}()
	return f(hctx)
}

// HoldContext returns a context derived from parent that ends when the
// calling goroutine's hold of rw ends (its write hold if it has one, else
// its read hold), as DistMutex.HoldContext does.
func (rw *DistRWMutex) HoldContext(parent context.Context) context.Context {
	return rw.w.client().holdContext(parent, rw.holdLocked, rw.w.wrapOp("lock", ErrNotHeld))
}

// Do runs f under rw's write lock, as DistMutex.Do does.
func (rw *DistRWMutex) Do(ctx context.Context, f func(ctx context.Context) error) error {
	return rw.w.Do(ctx, f)
}

// RDo runs f under rw's read lock, as DistMutex.Do does under a mutex: the
// context f gets ends when the read hold is lost.
func (rw *DistRWMutex) RDo(ctx context.Context, f func(ctx context.Context) error) error {
	return rw.r.Do(ctx, f)
}
