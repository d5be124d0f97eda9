package remutex

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Tests of what belongs to one acquisition: its options, whichever value of
// the name a call goes through, its minimum hold, however its release
// reaches Redis, and the answer of a release of a hold that ended by
// someone else's doing.

// TestCallsKeepTheAcquisitionsLease: two values of one name with different
// leases share their holds; a nested Lock or Unlock through the other value
// keeps the lease of the acquisition that made the hold, so that the key
// never expires before the hold's local validity ends.
func TestCallsKeepTheAcquisitionsLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		c := b.client(t)
		long := c.NewMutex(name)                                   // 30s
		short := c.NewMutex(name, WithLease(100*time.Millisecond)) // same name, shorter lease
		other := b.client(t).NewMutex(name)
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		pttl := func(what string) time.Duration {
			t.Helper()
			d, err := rdb.PTTL(ctx, long.spec.hash()).Result()
			if err != nil {
				t.Fatalf("PTTL %s: %v", what, err)
			}
			return d
		}

		long.Lock()
		short.Lock() // nested, through the value with the short lease
		if d := pttl("after a nested Lock through the short value"); d < time.Second {
			t.Errorf("TTL after a nested Lock through the short value: got %v, want the long lease's (> 1s)", d)
		}
		short.Unlock() // nested Unlock through it
		if d := pttl("after a nested Unlock through the short value"); d < time.Second {
			t.Errorf("TTL after a nested Unlock through the short value: got %v, want the long lease's (> 1s)", d)
		}
		b.elapse(300 * time.Millisecond) // three short leases
		if other.TryLock() {
			t.Fatal("another Client's TryLock while the goroutine holds the lock: got true, want false")
		}
		select {
		case <-long.Lost():
			t.Fatal("the hold was lost")
		default:
		}
		short.Unlock() // the final one, through the other value
		if !other.TryLock() {
			t.Fatal("another Client's TryLock after the final Unlock: got false, want true")
		}
		other.Unlock()

		// And the other way round: a hold of the short lease stays short.
		short.Lock()
		long.Lock()
		if d := pttl("after a nested Lock through the long value"); d > 100*time.Millisecond {
			t.Errorf("TTL after a nested Lock through the long value: got %v, want the short lease's (<= 100ms)", d)
		}
		long.Unlock()
		long.Unlock()
	})
}

// TestMinHoldKeptByAPostedRelease: an UnlockContext cut off by its context
// posts the release; that release keeps the minimum hold, so that another
// process does not run the same job again right after.
func TestMinHoldKeptByAPostedRelease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const minHold = 5 * time.Second
		m := b.client(t).NewMutex(name, WithMinHold(minHold))
		other := b.client(t).NewMutex(name)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)
		m.Lock()
		owner := ownerString(m.current().owner)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if err := m.UnlockContext(done); !errors.Is(err, context.Canceled) {
			t.Fatalf("UnlockContext with a done context: got %v, want context.Canceled", err)
		}
		waitFor(t, "the posted release to reach Redis", func() bool {
			return !rdb.HExists(ctx, m.spec.hash(), owner).Val()
		})
		if !rdb.HExists(ctx, m.spec.hash(), keptPrefix+owner).Val() {
			t.Errorf("after the posted release: the key is not kept for the minimum hold (fields %v)", rdb.HKeys(ctx, m.spec.hash()).Val())
		}
		if other.TryLock() {
			t.Fatal("another Client's TryLock within the minimum hold: got true, want false")
		}
		if d := rdb.PTTL(ctx, m.spec.hash()).Val(); d <= 0 || d > minHold {
			t.Errorf("TTL of the kept key: got %v, want in (0, %v]", d, minHold)
		}
	})
}

// TestReleaseOfAnEndedHold: a release that finds the hold ended by someone
// else (ForceUnlock, the key deleted), even while its local validity
// lasts, reports ErrLockLost, closes Lost and leaves the new holder alone;
// Unlock reports it to the error handler.
func TestReleaseOfAnEndedHold(t *testing.T) {
	ends := []struct {
		name string
		end  func(ctx context.Context, t *testing.T, b *testBackend, name string)
	}{
		{"ForceUnlock", func(ctx context.Context, t *testing.T, b *testBackend, name string) {
			if ok, err := b.client(t).ForceUnlock(ctx, name); !ok || err != nil {
				t.Fatalf("ForceUnlock: got %v, %v; want true, nil", ok, err)
			}
		}},
		{"key deleted", func(ctx context.Context, t *testing.T, b *testBackend, name string) {
			if err := b.rdb(t).Del(ctx, keysOf(name).hash).Err(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, end := range ends {
		t.Run(end.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *testBackend) {
				for _, plain := range []bool{false, true} {
					name := lockName(t)
					c, errs := clientWithErrors(t, b.rdb(t))
					m := c.NewMutex(name)
					other := b.client(t).NewMutex(name)
					ctx := testCtx(t, hangGuard)
					m.Lock()
					lost := m.Lost()
					end.end(ctx, t, b, name)
					if !other.TryLock() {
						t.Fatal("another Client's TryLock after the hold ended: got false, want true")
					}
					if plain {
						m.Unlock()
						errs.await(t, ErrLockLost, 10*time.Second, "Unlock to report the loss")
					} else if err := m.UnlockContext(ctx); !errors.Is(err, ErrLockLost) {
						t.Errorf("UnlockContext of a hold that ended: got %v, want ErrLockLost", err)
					}
					select {
					case <-lost:
					default:
						t.Error("Lost is open after the release found the hold ended")
					}
					if got := other.HoldCount(); got != 1 {
						t.Errorf("the new holder's HoldCount: got %d, want 1", got)
					}
					if n := len(b.rdb(t).HKeys(ctx, keysOf(name).hash).Val()); n != 1 {
						t.Errorf("fields of the lock after the release: got %d, want the new holder's alone", n)
					}
					other.Unlock()
				}
			})
		})
	}
}

// TestSemaphoreReleaseOfAForcedHolding: ReleaseContext of permits whose
// holding was released by ForceUnlock reports ErrLockLost.
func TestSemaphoreReleaseOfAForcedHolding(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		s := b.client(t).NewSemaphore(name, 2)
		ctx := testCtx(t, hangGuard)
		if err := s.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if ok, err := b.client(t).ForceUnlock(ctx, name); !ok || err != nil {
			t.Fatalf("ForceUnlock: got %v, %v; want true, nil", ok, err)
		}
		if err := s.ReleaseContext(ctx, 1); !errors.Is(err, ErrLockLost) {
			t.Errorf("ReleaseContext of a forced holding: got %v, want ErrLockLost", err)
		}
	})
}

// TestOwnerTokenPerAcquisition: every acquisition of a goroutine has an
// owner token of its own (<client id>:<goroutine id>.<n>), so that a call
// of an earlier one cannot change a later one.
func TestOwnerTokenPerAcquisition(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		m := b.client(t).NewMutex(lockName(t))
		seen := map[string]bool{}
		for range 3 {
			m.Lock()
			owner := ownerString(m.current().owner)
			m.Unlock()
			if seen[owner] {
				t.Fatalf("owner token %q given to two acquisitions", owner)
			}
			seen[owner] = true
			if id, _, _ := strings.Cut(owner, ":"); id != m.c.id {
				t.Errorf("owner token %q: want it to begin with the Client id %q", owner, m.c.id)
			}
		}
	})
}
