package remutex

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// DistSemaphore is a counting semaphore shared by every process that uses
// its name: at most Size permits are held at once, across all of them. It
// is golang.org/x/sync/semaphore's Weighted across processes, with leases:
//
//   - Permits belong to the DistSemaphore value, not to goroutines: any
//     goroutine may release what another acquired, and the permits of one
//     value are interchangeable. Two values of the same name (in one Client
//     or in two) are two holders that share the Size.
//   - Each Acquire is a holding of its own in Redis with its own lease,
//     which the Client's watchdog renews (WithoutRenewal: a fixed lease), so
//     that the permits of a process that dies come back when its lease ends.
//     A holding that is lost all the same (its lease ran out, its key was
//     deleted) closes the Lost channel it was acquired with and ends its Do
//     context; its permits are then not held, and releasing them reports
//     ErrLockLost instead of panicking.
//   - Waiters queue in Redis, first in, first out: a request that does not
//     fit blocks the smaller ones behind it, as x/sync's does, and a release
//     hands the permits to the head of the queue itself (one message to its
//     Client), so nobody polls.
//   - Acquire of more than Size permits fails at once (ErrTooManyPermits),
//     where x/sync's waits for its context.
//   - The size is stored in Redis (P{name}:sem:size, kept like the fence
//     counter): a DistSemaphore of another size under the same name gets
//     *SizeError instead of a silent mixture, from its first acquisition
//     on. It is checked at every acquisition but one kind: once a value's
//     size was found right, an Acquire(1) that finds nobody holding or
//     waiting takes its permit unchecked (one permit fits any size; the
//     saving is a sixth of Redis's work per uncontended cycle). To
//     resize, make sure nothing holds or waits, delete that key, and
//     restart every process with the new size.
//   - WithFencing gives each acquisition a token from the semaphore's
//     counter (Fence, and the context of Do).
//   - A quorum Client (NewQuorumClient) cannot bound a count by majorities:
//     three servers and two permits let three holders each win a majority.
//     NewSemaphore panics on one.
//
// Its keys are P{name}:sem (its holders), P{name}:sem:fence,
// P{name}:sem:waiting and P{name}:sem:size for the Client's prefix P: one
// cluster slot. A zero DistSemaphore is not usable: create it with
// Client.NewSemaphore.
type DistSemaphore struct {
	_    noCopy
	m    DistMutex // the protocol: a hold per acquisition, none per goroutine
	size int64

	// mu orders the releases of one holding: a release sets an absolute
	// count, and two of them out at once could land in either order.
	mu      sync.Mutex
	freed   *sync.Cond // signalled when a holding's release settles
	sending map[*hold]bool
}

// ErrTooManyPermits is returned (wrapped) by Acquire and TryAcquireContext
// asked for more permits than the semaphore's size: no release could ever
// let them in.
var ErrTooManyPermits = errors.New("remutex: more permits asked for than the semaphore's size")

// SizeError is the error of a DistSemaphore whose size differs from the one
// stored in Redis for its name: processes that disagree on the size would
// each let in a different number of holders.
type SizeError struct {
	Key    string // the key that holds the size: P{name}:sem:size
	Size   int64  // this DistSemaphore's
	Stored int64  // Redis's
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("remutex: semaphore of size %d, but %s holds %d: every process must use the same size (to resize, delete that key while nothing holds or waits)", e.Size, e.Key, e.Stored)
}

// NewSemaphore returns the semaphore called name, of size permits. It
// accepts the options of a mutex that apply: WithLease, WithoutRenewal and
// WithFencing (NonReentrant is what a semaphore always is). It sends no
// command. It panics if name is invalid (see CheckName), if size is not
// positive or above 2³¹-1, if an option is invalid or WithMinHold (a
// mutex's), or if c is a quorum Client.
func (c *Client) NewSemaphore(name string, size int64, opts ...MutexOption) *DistSemaphore {
	cfg := c.configure("NewSemaphore", name, opts)
	if size <= 0 || size > maxPermits {
		panic(fmt.Sprintf("remutex: NewSemaphore(%q, %d): the size must be between 1 and %d", name, size, maxPermits))
	}
	c.refuseQuorum("NewSemaphore", semKind)
	cfg.nonReentrant = true
	s := &DistSemaphore{size: size, sending: map[*hold]bool{}}
	s.m.init(c, name, cfg, semKind)
	s.m.spec.Size = strconv.FormatInt(size, 10)
	s.m.spec.Sized = new(atomic.Bool)
	s.freed = sync.NewCond(&s.mu)
	return s
}

// Name returns the semaphore's name.
func (s *DistSemaphore) Name() string { return s.m.Name() }

// Size returns the number of permits the semaphore has.
func (s *DistSemaphore) Size() int64 {
	s.m.client()
	return s.size
}

// Acquire takes n permits, waiting in the semaphore's queue until they are
// free or ctx ends. It returns nil having taken them, else an error, having
// taken none: ctx's error, ErrTooManyPermits for n above the size, ErrClosed,
// *SizeError, or a permanent Redis error (wrapped in a *LockError naming the
// semaphore). It waits through transient errors, as LockContext does, and
// returns within about 50ms of ctx's end whatever Redis does. n = 0 returns
// nil (ctx's error if it is done). It panics if n is negative.
func (s *DistSemaphore) Acquire(ctx context.Context, n int64) error {
	_, err := s.acquire(ctx, n, false)
	return err
}

// TryAcquire takes n permits if they are free and nobody waits for any (a
// request that came first is served first), with one call; it reports
// whether it took them. It answers within TryLockTimeout whatever Redis
// does; it returns false on a transient error and on a closed Client, and
// panics on the errors Acquire returns besides those (ErrTooManyPermits,
// *SizeError, a key of another type), as TryLock does. TryAcquire(0) is
// true.
func (s *DistSemaphore) TryAcquire(n int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), TryLockTimeout)
	defer cancel()
	h, err := s.acquire(ctx, n, true)
	if err != nil && !cutOff(ctx, err) && !transient(err) && !errors.Is(err, ErrClosed) {
		panic(err) // the error itself, as TryLock's: errors.As works on the recovered value
	}
	return h != nil || err == nil && n == 0
}

// TryAcquireContext is TryAcquire with a context and an error: false, nil
// when the permits are not free (or others wait); false and the error when
// it could not tell.
func (s *DistSemaphore) TryAcquireContext(ctx context.Context, n int64) (bool, error) {
	h, err := s.acquire(ctx, n, true)
	return h != nil || err == nil && n == 0, err
}

// acquire is the one implementation of the Acquire family. It returns the
// holding it took, nil for n = 0 or a TryAcquire that found no room.
func (s *DistSemaphore) acquire(ctx context.Context, n int64, try bool) (*hold, error) {
	m := &s.m
	c := m.client()
	op := "acquire"
	if try {
		op = "tryacquire"
	}
	switch {
	case n < 0:
		panic(fmt.Sprintf("remutex: semaphore %q: %d permits asked for", m.spec.name, n))
	case n > s.size:
		return nil, m.wrapOp(op, fmt.Errorf("%w: %d of %d", ErrTooManyPermits, n, s.size))
	}
	if err := ctx.Err(); err != nil {
		return nil, m.wrapOp(op, err)
	}
	if n == 0 {
		return nil, nil
	}
	c.mu.Lock()
	if c.closed || c.draining {
		c.mu.Unlock()
		return nil, m.wrapOp(op, ErrClosed)
	}
	h, err := m.take(ctx, 0, try, int(n))
	if err != nil {
		var se *SizeError
		if errors.As(err, &se) {
			se.Size = s.size
		}
		return nil, m.wrapOp(op, err)
	}
	if h != nil {
		m.spec.Sized.Store(true) // (Redis agreed to it)
	}
	return h, nil
}

// Release gives back n permits that the value holds, as x/sync's does:
// from its latest acquisitions first, lowering one if it holds more than
// what is left to give back; Redis hands them to the queue's head at once.
// Permits that were lost are given back first, without a call (their loss
// is reported to the error handler). Errors of the release are reported to
// the error handler too: a release of a holding's last permits that could
// not reach Redis is sent again in the background (the lease ends the
// holding at the latest); one that lowers a holding leaves Redis counting
// the permits it gave back until the holding's next release or its end
// (counts are absolute: the next one sets it right). It panics if n is negative or more than the value holds, counting
// lost permits not released yet (x/sync panics likewise). It returns
// within UnlockTimeout (1s) whatever Redis does, as DistMutex.Unlock.
func (s *DistSemaphore) Release(n int64) {
	if err := s.release(unlockCtx, n, true); err != nil {
		s.m.c.report(err)
	}
}

// ReleaseContext is Release with a context and an error: nil when every
// permit was held and given back; an error matching ErrLockLost when some
// had been lost; ErrNotHeld when n is more than the value holds (nothing is
// released then, unless another release of the value runs at the same
// time); the release's error otherwise.
func (s *DistSemaphore) ReleaseContext(ctx context.Context, n int64) error {
	return s.release(ctx, n, false)
}

// release is the one implementation of Release and ReleaseContext.
func (s *DistSemaphore) release(ctx context.Context, n int64, plain bool) error {
	m := &s.m
	m.client()
	if n < 0 {
		panic(fmt.Sprintf("remutex: semaphore %q: %d permits released", m.spec.name, n))
	}
	var errs []error
	for n > 0 {
		h, k, err := s.pick(n, plain)
		if err != nil {
			return err
		}
		errs = append(errs, s.releaseHold(ctx, h, k))
		n -= int64(k)
	}
	return errors.Join(errs...)
}

// pick chooses the holding that the next part of a release of n permits
// lowers, and by how much: a lost one first, else the latest acquisition
// that no other release is sending; if those are out, it waits for them.
func (s *DistSemaphore) pick(n int64, plain bool) (*hold, int, error) {
	m := &s.m
	c := m.c
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		c.mu.Lock()
		var held int64
		var pick *hold
		for _, h := range m.nr {
			if h.ending {
				continue
			}
			held += int64(h.count)
			if !s.sending[h] && (pick == nil || h.lostErr != nil || pick.lostErr == nil) {
				pick = h // a lost one, else the latest
			}
		}
		c.mu.Unlock()
		switch {
		case n > held:
			if plain {
				panic(fmt.Sprintf("%s %q: %d released, %d held", m.spec.unheld, m.spec.name, n, held))
			}
			return nil, 0, m.wrapOp("release", fmt.Errorf("%w: %d released, %d held", ErrNotHeld, n, held))
		case pick != nil:
			k := int(min(n, int64(pick.count)))
			s.sending[pick] = true
			return pick, k, nil
		}
		s.freed.Wait() // every holding's release is out: wait for one
	}
}

// releaseHold gives back k of h's permits (all of them: the holding ends).
func (s *DistSemaphore) releaseHold(ctx context.Context, h *hold, k int) error {
	m := &s.m
	c := m.c
	defer func() {
		s.mu.Lock()
		delete(s.sending, h)
		s.freed.Broadcast()
		s.mu.Unlock()
	}()
	c.mu.Lock()
	var news []notice
	if h.lostErr == nil && !time.Now().Before(h.valid) {
		// Past its validity the holding may be gone on the server: lost.
		news = c.loseLocked(h, errExpired)
	}
	if h.lostErr != nil {
		h.count -= k
		lost := h.lostErr
		if h.count <= 0 {
			m.dropHoldLocked(h)
		}
		c.mu.Unlock()
		c.announce(news)
		return m.wrapOp("release", lost)
	}
	want := h.count - k
	h.ending = want == 0
	valid := h.valid
	c.mu.Unlock()
	return m.settle(h, want, m.release(ctx, h, want, valid), false)
}

// Held returns the permits the value holds: those acquired, not released,
// not lost.
func (s *DistSemaphore) Held() int64 {
	m := &s.m
	c := m.client()
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, h := range m.nr {
		if h.lostErr == nil && !h.ending {
			n += int64(h.count)
		}
	}
	return n
}

// Lost returns a channel that is closed when the value's latest acquisition
// still held is lost (closed already if it holds nothing). Each acquisition
// has its own: take it right after Acquire, or use Do, whose context ends
// with that acquisition.
func (s *DistSemaphore) Lost() <-chan struct{} { return s.m.client().lostOf(s.latestLocked) }

// Fence returns the fencing token of the value's latest acquisition still
// held: 0 without WithFencing or if it holds nothing. Do gives each
// acquisition's own.
func (s *DistSemaphore) Fence() int64 { return s.m.client().fenceOf(s.latestLocked) }

func (s *DistSemaphore) latestLocked() *hold {
	for i := len(s.m.nr) - 1; i >= 0; i-- {
		if h := s.m.nr[i]; h.lostErr == nil && !h.ending {
			return h
		}
	}
	return nil
}

// Do runs f holding n permits: it acquires them with Acquire(ctx, n), calls
// f with a context that ends when that acquisition is lost (its cause
// matches ErrLockLost) or ctx ends, and gives the permits back when f
// returns, also when f panics (the panic goes on). fence is the
// acquisition's token (0 without WithFencing). It returns Acquire's error
// without calling f, else f's error joined with the release's: errors.Is(err,
// ErrLockLost) says that the permits were lost before f finished.
func (s *DistSemaphore) Do(ctx context.Context, n int64, f func(ctx context.Context, fence int64) error) (err error) {
	h, err := s.acquire(ctx, n, false)
	if err != nil || h == nil {
		if err == nil {
			err = f(ctx, 0)
		}
		return err
	}
	c := s.m.c
	hctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	lost := h.lostErr
	if lost == nil {
		h.ctxs = append(h.ctxs, cancel)
	}
	fence := h.fence
	c.mu.Unlock()
	if lost != nil {
		cancel(s.m.wrapOp("acquire", lost))
	}
	defer func() {
		// The permits of this acquisition that are left (a Release may have
		// given back some or all of them meanwhile).
		s.mu.Lock()
		for s.sending[h] {
			s.freed.Wait()
		}
		c.mu.Lock()
		k := h.count
		if h.dropped || h.ending {
			k = 0
		}
		c.mu.Unlock()
		if k > 0 {
			s.sending[h] = true
		}
		s.mu.Unlock()
		if k > 0 {
			err = errors.Join(err, s.releaseHold(context.WithoutCancel(ctx), h, k))
		}
		cancel(ErrReleased)
	}()
	return f(hctx, fence)
}

// maxPermits bounds a semaphore's size: Lua, which counts the permits, has
// no integers, and its numbers are exact to 2^53 only.
const maxPermits = math.MaxInt32
