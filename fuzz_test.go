package remutex

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Bad-input fuzzing on miniredis (fast, and it never expires keys on its
// own, so every key left behind is visible). For any input: a documented
// panic (starting "remutex: ") or a working mutex; never a hang, another
// panic, or a key left that the documentation does not name. The seed
// corpora live in testdata/fuzz and run as ordinary tests.

// fuzzTimeout bounds every call of a fuzz body: a call that takes longer
// counts as a hang.
const fuzzTimeout = 5 * time.Second

// fuzzBackend is one miniredis and one connection pool for all inputs of a
// fuzz target, flushed before each input.
func fuzzBackend(f *testing.F) (*miniredis.Miniredis, *redis.Client) {
	mr := miniredis.RunT(f)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	f.Cleanup(func() { _ = rdb.Close() })
	return mr, rdb
}

// fuzzCall runs f on its own goroutine (holds belong to it) and fails the
// test if it does not return within fuzzTimeout. It returns what f panicked
// with, if anything.
func fuzzCall(t *testing.T, what string, f func()) interface{} {
	t.Helper()
	done := make(chan interface{}, 1)
	go func() {
		defer func() { done <- recover() }()
		f()
	}()
	select {
	case p := <-done:
		return p
	case <-time.After(fuzzTimeout):
		t.Fatalf("%s: no return within %v", what, fuzzTimeout)
	}
	return nil
}

// fuzzDocumentedPanic fails the test unless p is nil or a documented panic.
func fuzzDocumentedPanic(t *testing.T, what string, p interface{}) bool {
	t.Helper()
	if p == nil {
		return false
	}
	if s := fmt.Sprint(p); !strings.HasPrefix(s, "remutex: ") {
		t.Fatalf("%s panicked with %q, want nothing or a \"remutex: \" panic", what, s)
	}
	return true
}

// fuzzStrayKeys fails the test if keys other than a lock's documented
// leftovers remain: the fence counter (kept, without TTL, with fencing).
func fuzzStrayKeys(t *testing.T, mr *miniredis.Miniredis, hashes map[string]bool) {
	t.Helper()
	for _, key := range mr.Keys() {
		ok := false
		for hash, fencing := range hashes {
			if key == hash+":fence" {
				ok = fencing
			}
			if ok {
				break
			}
		}
		if !ok {
			t.Errorf("stray key %q (TTL %v) after lock and unlock", key, mr.TTL(key))
		}
	}
}

// FuzzNewMutex: arbitrary key prefix, lock name, lease and option set.
// flags: 1 WithLease(leaseMs), 2 WithoutRenewal, 4 WithFencing,
// 8 NonReentrant, 16 WithKeyPrefix(prefix).
func FuzzNewMutex(f *testing.F) {
	f.Add("remutex:", "orders", int64(1000), uint8(1|4))
	f.Add("", "", int64(0), uint8(0))
	f.Add("p:", "}starts-with-brace", int64(30000), uint8(16))
	f.Add("a{b}", "name", int64(49), uint8(1|16))
	f.Add("x", "\x00\xff{}", int64(50), uint8(1|2|4|8|16))
	mr, rdb := fuzzBackend(f)
	f.Fuzz(func(t *testing.T, prefix, name string, leaseMs int64, flags uint8) {
		mr.FlushAll()
		var copts []Option
		effPrefix := DefaultKeyPrefix
		if flags&16 != 0 {
			copts = append(copts, WithKeyPrefix(prefix))
			effPrefix = prefix
		}
		lease := time.Duration(leaseMs) * time.Millisecond
		var opts []MutexOption
		if flags&1 != 0 {
			opts = append(opts, WithLease(lease))
		}
		if flags&2 != 0 {
			opts = append(opts, WithoutRenewal())
		}
		fencing := flags&4 != 0
		if fencing {
			opts = append(opts, WithFencing())
		}
		reentrant := flags&8 == 0
		if !reentrant {
			opts = append(opts, NonReentrant())
		}

		var c *Client
		if fuzzDocumentedPanic(t, "NewClient", fuzzCall(t, "NewClient", func() { c = NewClient(rdb, copts...) })) {
			if !strings.ContainsAny(effPrefix, "{}") {
				t.Fatalf("NewClient refused the prefix %q", effPrefix)
			}
			return
		}
		if strings.ContainsAny(effPrefix, "{}") {
			t.Fatalf("NewClient accepted the prefix %q", effPrefix)
		}
		defer func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		var m *DistMutex
		if fuzzDocumentedPanic(t, "NewMutex", fuzzCall(t, "NewMutex", func() { m = c.NewMutex(name, opts...) })) {
			if keys := mr.Keys(); len(keys) != 0 {
				t.Errorf("a refused NewMutex wrote keys: %q", keys)
			}
			return
		}
		switch {
		case name == "" || len(name) > MaxNameLen:
			t.Fatalf("NewMutex accepted a name of %d bytes", len(name))
		case flags&1 != 0 && (lease < MinLease || lease > MaxLease):
			t.Fatalf("NewMutex accepted WithLease(%v)", lease)
		case m.Name() != name:
			t.Fatalf("Name() = %q, want %q", m.Name(), name)
		}

		// A loss is what a short or fixed lease may legitimately produce.
		okOrLost := func(what string, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, ErrLockLost) {
				t.Errorf("%s: %v", what, err)
			}
		}
		p := fuzzCall(t, "lock and unlock", func() {
			ctx, cancel := context.WithTimeout(context.Background(), fuzzTimeout)
			defer cancel()
			if err := m.LockContext(ctx); err != nil {
				t.Errorf("LockContext on a free lock: %v", err)
				return
			}
			if reentrant {
				okOrLost("nested LockContext", m.LockContext(ctx))
				if m.TryLock() {
					okOrLost("UnlockContext after TryLock", m.UnlockContext(ctx))
				}
			} else if m.TryLock() {
				t.Errorf("TryLock of a held NonReentrant mutex succeeded")
			}
			for m.HoldCount() > 0 {
				okOrLost("UnlockContext", m.UnlockContext(ctx))
			}
			// A hold lost at a nested count owes its remaining unlocks
			// ErrLockLost (at most the three locks above), then ErrNotHeld.
			err := m.UnlockContext(ctx)
			for i := 0; i < 3 && errors.Is(err, ErrLockLost); i++ {
				err = m.UnlockContext(ctx)
			}
			if !errors.Is(err, ErrNotHeld) {
				t.Errorf("UnlockContext of a mutex not held: %v, want ErrNotHeld", err)
			}
		})
		if p != nil {
			t.Fatalf("lock and unlock panicked: %v", p)
		}
		if p := fuzzCall(t, "Unlock", m.Unlock); !strings.HasPrefix(fmt.Sprint(p), "remutex: unlock of unlocked mutex") {
			t.Errorf("Unlock of a mutex not held panicked with %v, want \"remutex: unlock of unlocked mutex\"", p)
		}
		fuzzStrayKeys(t, mr, map[string]bool{effPrefix + "{" + name + "}": fencing})
	})
}

// FuzzLockNames: two Clients lock two arbitrary names. Distinct names never
// exclude each other, equal names always do, and nothing is left behind.
func FuzzLockNames(f *testing.F) {
	f.Add("a", "a")
	f.Add("a", "b")
	f.Add("x", "x}:fence")
	f.Add("{a}", "a")
	mr, rdb := fuzzBackend(f)
	f.Fuzz(func(t *testing.T, name1, name2 string) {
		mr.FlushAll()
		c1, c2 := NewClient(rdb), NewClient(rdb)
		defer func() {
			if err := errors.Join(c1.Close(), c2.Close()); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		var m1, m2 *DistMutex
		p1 := fuzzCall(t, "NewMutex", func() { m1 = c1.NewMutex(name1, WithFencing()) })
		p2 := fuzzCall(t, "NewMutex", func() { m2 = c2.NewMutex(name2, WithFencing()) })
		if fuzzDocumentedPanic(t, "NewMutex", p1) || fuzzDocumentedPanic(t, "NewMutex", p2) {
			return
		}
		var ok1, ok2 bool
		var err1, err2 error
		p := fuzzCall(t, "TryLock both", func() {
			ctx, cancel := context.WithTimeout(context.Background(), fuzzTimeout)
			defer cancel()
			ok1, err1 = m1.TryLockContext(ctx)
			ok2, err2 = m2.TryLockContext(ctx)
			if ok2 {
				err2 = errors.Join(err2, m2.UnlockContext(ctx))
			}
			if ok1 {
				err1 = errors.Join(err1, m1.UnlockContext(ctx))
			}
		})
		if p != nil {
			t.Fatalf("TryLock both panicked: %v", p)
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("errors: %v, %v", err1, err2)
		}
		if !ok1 || ok2 != (name1 != name2) {
			t.Errorf("TryLock(%q) = %v, then TryLock(%q) from another Client = %v", name1, ok1, name2, ok2)
		}
		fuzzStrayKeys(t, mr, map[string]bool{
			DefaultKeyPrefix + "{" + name1 + "}": true,
			DefaultKeyPrefix + "{" + name2 + "}": true,
		})
	})
}
