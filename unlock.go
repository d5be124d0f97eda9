package remutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/remutex/remutex/internal/transport"
)

// The release side of DistMutex: Unlock and UnlockContext lower a hold's
// count, and the final one releases the lock and passes it on.

// UnlockTimeout bounds Unlock (and Release, RUnlock): it returns within it
// whatever Redis does, and the release goes on in the background. With a
// go-redis client that has ContextTimeoutEnabled, Unlock sends its release
// on its own goroutine when nothing else of the Client is in flight (go-redis
// then ends the call at UnlockTimeout); otherwise a goroutine of the Client
// sends it, and Unlock stops waiting at UnlockTimeout.
const UnlockTimeout = time.Second

// unlockTimeout bounds how long a release retries a call that meets
// transient errors (Redis unreachable): then it gives up, reports the error,
// and the lock expires on the server within its lease.
const unlockTimeout = UnlockTimeout

// The transport bounds the calls of unlockCtx by UnlockTimeout too: a
// difference fails the build.
const _ = uint(UnlockTimeout-transport.UnlockTimeout) + uint(transport.UnlockTimeout-UnlockTimeout)

// unlockCtx is the context of the calls of Unlock (see transport.UnlockCtx).
var unlockCtx = transport.UnlockCtx

// unlock is the single implementation of Unlock and UnlockContext.
func (m *DistMutex) unlock(ctx context.Context, plain bool) error {
	c := m.client()
	gid := m.gid()
	c.mu.Lock()
	h := m.holdLocked(gid)
	var news []notice
	if h != nil && !h.ending && h.lostErr == nil && !time.Now().Before(h.valid) {
		// Past its validity deadline the hold may be gone on the server: it
		// is lost, whether or not the watchdog has looked yet.
		news = c.loseLocked(h, errExpired)
		h = m.holdLocked(gid) // it may have joined an earlier lost hold
	}
	if h == nil || h.ending {
		// (ending: a NonReentrant mutex whose final release another
		// goroutine is already sending.)
		msg := m.unheldLocked()
		c.mu.Unlock()
		if plain {
			panic(msg)
		}
		return m.wrapOp("unlock", ErrNotHeld)
	}
	// Every call on a hold keeps the options of the acquisition that made
	// it (lease, minimum hold, renewal), whichever value of the name
	// unlocks it.
	m = h.m
	if h.lostErr != nil {
		c.mu.Unlock()
		c.announce(news)
		return m.unlockEnded(ctx, h)
	}
	want := h.count - 1
	h.ending = want == 0
	valid := h.valid
	c.mu.Unlock()
	out := m.release(ctx, h, want, valid)
	return m.settle(h, want, out, plain)
}

// unlockEnded takes one of the Unlocks a lost hold is owed, reporting
// ErrLockLost. With the last, if the lock's field may still be on the
// server (lost by the local deadline during a partition), it is released
// for the others.
func (m *DistMutex) unlockEnded(ctx context.Context, h *hold) error {
	c := m.c
	c.mu.Lock()
	h.count--
	lost, clear := h.lostErr, false
	if h.count <= 0 {
		m.dropHoldLocked(h)
		clear = c.stateLocked(m).takeLeftoverLocked(h.owner)
	}
	c.mu.Unlock()
	if clear {
		if err := rollback(ctx, c.be, &m.spec, h.owner, m.releaseArg(h, 0)); err != nil {
			m.leftOver(h)
		}
	}
	return m.wrapOp("unlock", lost)
}

// unheldLocked is the panic of an Unlock by a goroutine (NonReentrant: of a
// mutex) that holds nothing, saying what it can.
func (m *DistMutex) unheldLocked() string {
	msg := fmt.Sprintf("%s %q", m.spec.unheld, m.spec.name)
	if !m.reentrant {
		return msg
	}
	msg += ": this goroutine holds nothing"
	if st := m.c.locks[m.spec.hash()]; st != nil {
		for _, h := range st.holds {
			if h.lostErr == nil {
				msg += " (another goroutine of this Client holds it)"
				break
			}
		}
	}
	return msg + "; a hold belongs to the goroutine that took it (NonReentrant lets any goroutine unlock)"
}

// release sends the release of h down to want, retrying transient errors
// for at most unlockTimeout while the hold can be valid. Its first call
// runs as a Lock's does: an Unlock's (no context) on the caller's goroutine
// when nothing else is in flight, with the redis client's own timeouts; an
// UnlockContext's returns at its context's end. The retries end by
// unlockTimeout whatever Redis does: a call still out then is one whose
// reply was lost, and the hold is dropped as after a failed release.
func (m *DistMutex) release(ctx context.Context, h *hold, want int, valid time.Time) released {
	sent := time.Now()
	lease := m.releaseArg(h, want)
	res, err := m.c.be.Release(ctx, &m.spec.Spec, h.owner, want, lease)
	if err == nil || !transient(err) && !errors.Is(err, context.DeadlineExceeded) {
		return released{res: res, sent: sent, err: err}
	}
	if ctx.Err() != nil {
		return released{sent: sent, err: ctxErr(ctx, err)}
	}
	bctx, cancel := context.WithDeadline(ctx, sent.Add(unlockTimeout))
	defer cancel()
	retryUntil := earliest(valid, sent.Add(unlockTimeout))
	var bo backoff
	for {
		wait := bo.Next()
		if !time.Now().Add(wait).Before(retryUntil) {
			return released{sent: sent, err: err}
		}
		m.warnRetry("unlock", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-bctx.Done():
			t.Stop()
		}
		sent = time.Now()
		res, err = m.c.be.Release(bctx, &m.spec.Spec, h.owner, want, lease)
		switch {
		case err == nil || !transient(err) && bctx.Err() == nil:
			return released{res: res, sent: sent, resent: true, err: err}
		case ctx.Err() != nil:
			return released{sent: sent, err: ctxErr(ctx, err)}
		case bctx.Err() != nil:
			return released{sent: sent, err: fmt.Errorf("no answer within %v (%w): %w", unlockTimeout, context.DeadlineExceeded, err)}
		}
	}
}

// released is the outcome of a release: its reply, or err, and the send
// time of its last call; resent if an earlier call of it, whose outcome is
// unknown, may have reached Redis.
type released struct {
	res    int64
	sent   time.Time
	resent bool
	err    error
}

// releaseArg is the lease argument of the release of h down to want: for a
// nested one the lease to set (or "0"), for the final one how long the key
// stays after it (WithMinHold; "0": deleted at once).
func (m *DistMutex) releaseArg(h *hold, want int) interface{} {
	if want == 0 && h.outcome != nil {
		return h.outcome // a DistOnce run's final release records its outcome
	}
	if want > 0 {
		return m.spec.keepArg
	}
	return keepArg(h.acquired.Add(m.spec.minHold))
}

// keepArg is the lease argument of a final release that keeps the key taken
// by nobody until end (the end of a minimum hold): the ms left, or "0".
func keepArg(end time.Time) interface{} {
	if keep := time.Until(end); keep >= time.Millisecond {
		return strconv.FormatInt(keep.Milliseconds(), 10)
	}
	return "0"
}

// settle records the outcome of the release of h down to want.
//
// A release that finds nothing of the hold tells that it ended before the
// release: the owner token is the acquisition's own, so nothing but this
// release (or an earlier copy of it) ends it, save a loss (the lease ran
// out, ForceUnlock, the key deleted, a failover that lost it). The one
// exception is a final release sent again after a call of it that failed
// (its outcome unknown: it may have been applied, and only its reply lost),
// while the hold was valid: that it finds nothing is the earlier call's
// doing, and it counts as done.
func (m *DistMutex) settle(h *hold, want int, out released, plain bool) error {
	c := m.c
	res, sent, err := out.res, out.sent, out.err
	c.mu.Lock()
	h.count = want
	h.ending = false
	var news []notice
	switch {
	case err != nil:
	case res == releaseNotHeld && want == 0 && out.resent && sent.Before(h.valid):
		res = releaseDone
	case res == releaseNotHeld:
		news = c.loseLocked(h, errHoldGone) // the loss itself, found by this call
	case want > 0 && m.renew:
		h.extendLocked(sent)
	}
	if want == 0 && h.lostErr == nil && (c.hook != nil || len(h.ctxs) > 0) {
		// Not lost (before or by this call): the hold ends here, released or
		// dropped after a failed release.
		n := notice{ctxs: h.takeContextsLocked(), cause: ErrReleased}
		if c.hook != nil {
			n.ev = h.event(EventReleased, time.Since(h.acquired), err)
		}
		news = append(news, n)
	}
	lost := h.lostErr
	if want == 0 {
		m.dropHoldLocked(h)
		if err != nil {
			m.leftOverLocked(h)
		}
	}
	c.mu.Unlock()
	if want == 0 && err != nil && !m.c.be.FreshOwners() {
		// The release may not have reached Redis (cut off, or failed): a
		// release that follows it (see transport.PostCtx) frees the lock once Redis
		// answers again, before it ends by its lease.
		postRelease(context.Background(), c.be, &m.spec, h.owner, m.releaseArg(h, 0))
	}
	c.announce(news)
	switch {
	case err != nil:
		return m.wrapOp("unlock", err)
	case lost != nil && !plain:
		return m.wrapOp("unlock", lost)
	}
	return nil
}
