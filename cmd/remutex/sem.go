package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/remutex/remutex"
)

// Semaphores from the command line: run --permits N takes one permit of the
// semaphore NAME of N permits (remutex.DistSemaphore), so that at most N
// runs of it hold one at once, on every machine that uses the same Redis.

// maxPermits is the largest --permits, as NewSemaphore allows.
const maxPermits = math.MaxInt32

// permitsFlag is --permits: a semaphore's size, 1 to maxPermits; 0 when not
// given (run then takes a mutex).
type permitsFlag int64

func (p *permitsFlag) String() string {
	if p == nil || *p == 0 {
		return "off"
	}
	return strconv.FormatInt(int64(*p), 10)
}

func (p *permitsFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || n > maxPermits {
		return fmt.Errorf("want a whole number of permits from 1 to %d", maxPermits)
	}
	*p = permitsFlag(n)
	return nil
}

// semLock is a DistSemaphore as a runLock: a run holds one permit. Its Lost
// and Fence are the DistSemaphore's own, those of its one acquisition.
type semLock struct{ *remutex.DistSemaphore }

func (s semLock) LockContext(ctx context.Context) error { return s.Acquire(ctx, 1) }
func (s semLock) TryLockContext(ctx context.Context) (bool, error) {
	return s.TryAcquireContext(ctx, 1)
}
func (s semLock) UnlockContext(ctx context.Context) error { return s.ReleaseContext(ctx, 1) }

// permitsHeld is the sum of the permits st's holders hold.
func (st lockStatus) permitsHeld() int64 {
	var n int64
	for _, h := range st.Holders {
		n += h.Count
	}
	return n
}

// semBusy says why run --permits found no permit of semaphore st free: all
// are held (by whom), or others wait first.
func semBusy(st lockStatus) string {
	held := st.permitsHeld()
	switch {
	case len(st.Holders) == 0 && st.Queued == 0:
		return fmt.Sprintf("semaphore %q had no permit free", st.Name) // (it is free now)
	case held < st.Size || len(st.Holders) == 0:
		return fmt.Sprintf("semaphore %q has %s queued, which go first (%d of its %d permits held)",
			st.Name, plural(st.Queued, "waiter"), held, st.Size)
	}
	by := make([]string, 0, 3)
	for i, h := range st.Holders {
		if i == 2 && len(st.Holders) > 3 {
			by = append(by, fmt.Sprintf("%d others", len(st.Holders)-2))
			break
		}
		who := h.describe()
		if h.Count != 1 {
			who += fmt.Sprintf(" with %d permits", h.Count)
		}
		by = append(by, who)
	}
	msg := fmt.Sprintf("semaphore %q has all its %d permits held, by %s", st.Name, st.Size, strings.Join(by, ", "))
	if st.Queued > 0 {
		msg += fmt.Sprintf(", and %s queued", plural(st.Queued, "waiter"))
	}
	return msg
}

// sizeMismatch reports an acquisition refused because the semaphore's size
// in Redis is not --permits: the command line is wrong (exit status 64),
// whatever the other runs agreed on. ok is false for any other error.
func (c *cli) sizeMismatch(err error, cfg runConfig) (code int, ok bool) {
	var se *remutex.SizeError
	if !errors.As(err, &se) {
		return 0, false
	}
	c.errorf("run: --permits %d, but semaphore %q has %d permits (%s): every run of a semaphore must give the same --permits; to resize it, delete that key while nothing holds or waits",
		cfg.permits, cfg.name, se.Stored, se.Key)
	return exitUsage, true
}
