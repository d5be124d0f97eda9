package remutex

import (
	"context"
	"time"
)

// The release side of DistMutex: Unlock and UnlockContext lower a hold's
// count, and the final one releases the lock and passes it on.

// unlockTimeout bounds how long Unlock retries a release that meets
// transient errors (Redis unreachable): then it gives up, reports the error,
// and the lock expires on the server within its lease.
const unlockTimeout = time.Second

// unlock is the single implementation of Unlock and UnlockContext.
func (m *DistMutex) unlock(ctx context.Context, plain bool) error {
	c := m.client()
	c.mu.Lock()
	h := m.holdLocked(m.gid())
	if h == nil || h.ending {
		// (ending: a NonReentrant mutex whose final release another
		// goroutine is already sending.)
		c.mu.Unlock()
		if plain {
			panic(m.spec.unheld)
		}
		return m.wrap(ErrNotHeld)
	}
	want := h.count - 1
	var news []notice
	if h.lostErr == nil && !time.Now().Before(h.valid) {
		// Past its validity deadline the hold may be gone on the server: it
		// is lost, whether or not the watchdog has looked yet.
		news = c.loseLocked(h, errExpired)
	}
	if lost := h.lostErr; lost != nil {
		h.count = want
		if want == 0 {
			m.dropHoldLocked(h)
		}
		c.mu.Unlock()
		c.announce(news)
		if want == 0 {
			// The lock may still be ours on the server (lost by the local
			// deadline during a partition): free it for the others.
			if err := rollback(ctx, c.be, &m.spec, h.owner); err != nil {
				m.leftOver(h)
			}
		}
		return m.wrap(lost)
	}
	h.ending = want == 0
	valid := h.valid
	c.mu.Unlock()
	res, sent, err := m.release(ctx, h, want, valid)
	return m.settle(h, want, res, sent, err, plain)
}

// release sends the release of h down to want, retrying transient errors
// while the hold can be valid, for at most unlockTimeout.
func (m *DistMutex) release(ctx context.Context, h *hold, want int, valid time.Time) (int64, time.Time, error) {
	sent := time.Now()
	res, err := m.c.be.release(ctx, &m.spec, h.owner, want, m.spec.keepArg)
	if err == nil || !transient(err) {
		return res, sent, err
	}
	ctx, cancel := context.WithDeadline(ctx, earliest(valid, sent.Add(unlockTimeout)))
	defer cancel()
	var bo backoff
	for err != nil && transient(err) {
		m.c.log.Warn("remutex: retrying after transient error", "lock", m.spec.name, "op", "release", "err", err)
		t := time.NewTimer(bo.next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, sent, m.ctxErr(ctx, err)
		}
		sent = time.Now()
		res, err = m.c.be.release(ctx, &m.spec, h.owner, want, m.spec.keepArg)
	}
	return res, sent, err
}

// settle records the outcome of the release of h down to want.
//
// A final release that finds nothing, sent while the hold was still valid,
// counts as done: it is a resend of a release that was applied (go-redis
// resends a call whose reply was lost; release retries after an error), and
// the hold was the caller's until the critical section ended, because
// nothing else can end a valid hold but a loss the watchdog then reports.
func (m *DistMutex) settle(h *hold, want int, res int64, sent time.Time, err error, plain bool) error {
	c := m.c
	c.mu.Lock()
	var news []notice
	switch {
	case err != nil:
	case res == releaseNotHeld && want == 0 && sent.Before(h.valid):
		res = releaseDone
	case res == releaseNotHeld:
		news = c.loseLocked(h, errHoldGone) // the loss itself, found by this call
	case want > 0 && m.renew:
		h.extendLocked(sent)
	}
	if want == 0 && h.lostErr == nil && c.hook != nil {
		// Not lost (before or by this call): the hold ends here, released or
		// dropped after a failed release.
		news = append(news, notice{ev: h.event(EventReleased, time.Since(h.acquired), err)})
	}
	lost := h.lostErr
	h.count = want
	h.ending = false
	if want == 0 {
		m.dropHoldLocked(h)
		if err != nil {
			m.leftOverLocked(h)
		}
	}
	c.mu.Unlock()
	c.announce(news)
	switch {
	case err != nil:
		return m.wrap(err)
	case lost != nil && !plain:
		return m.wrap(lost)
	}
	return nil
}
