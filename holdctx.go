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
	ctx, cancel := context.WithCancelCause(parent)
	m.attach(cancel)
	return ctx
}

// attach gives the calling goroutine's live hold a context to end with it,
// or ends it at once if there is none.
func (m *DistMutex) attach(cancel context.CancelCauseFunc) {
	c := m.client()
	c.mu.Lock()
	h := m.liveLocked(m.gid())
	if h != nil {
		h.ctxs = append(h.ctxs, cancel)
	}
	c.mu.Unlock()
	if h == nil {
		cancel(m.wrapOp("lock", ErrNotHeld))
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
	ctx, cancel := context.WithCancelCause(parent)
	rw.attach(cancel)
	return ctx
}

func (rw *DistRWMutex) attach(cancel context.CancelCauseFunc) {
	c := rw.w.client()
	c.mu.Lock()
	h := rw.holdLocked()
	if h != nil {
		h.ctxs = append(h.ctxs, cancel)
	}
	c.mu.Unlock()
	if h == nil {
		cancel(rw.w.wrapOp("lock", ErrNotHeld))
	}
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
