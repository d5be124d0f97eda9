package remutex

// DistRWMutex across Clients (each on a connection pool of its own, standing
// for a process): writer preference, readers that enter together, downgrade,
// upgrade, misuse, NonReentrant, wake-up by message, cancellation, keys of
// another type, the watchdog's batches and lost holds.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() {
	for name, s := range map[string]*luaScript{
		"wlock": writeScripts.acquire, "wunlock": writeScripts.release, "rwleave": writeScripts.leave,
		"rlock": readScripts.acquire, "runlock": readScripts.release,
	} {
		scriptNames[s.Hash()] = name
	}
	// The uncontended cycle's quick_rlock.lua is the free path of rlock.lua;
	// rwwake.lua follows a plain release that found somebody queued.
	scriptNames[quickRLock.Hash()] = "rlock"
	scriptNames[rwWake.Hash()] = "rwwake"
}

// rwKeyNames are the keys of a read/write lock under the default prefix.
type rwKeyNames struct {
	w, fence, queue, readers string
}

func rwKeysOf(name string) rwKeyNames {
	k := rwKeys(DefaultKeyPrefix, name)
	return rwKeyNames{w: k[0], fence: k[1], queue: k[2], readers: k[3]}
}

func (k rwKeyNames) all() []string { return []string{k.w, k.fence, k.queue, k.readers} }

// rwState is what the server holds of a read/write lock: writers, readers,
// queue entries.
type rwState struct{ writers, readers, queued int64 }

func rwStateOf(t testing.TB, rdb *redis.Client, k rwKeyNames) rwState {
	t.Helper()
	ctx := context.Background()
	var w, r, q *redis.IntCmd
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		w, r, q = p.HLen(ctx, k.w), p.ZCard(ctx, k.readers), p.LLen(ctx, k.queue)
		return nil
	})
	require.NoError(t, err)
	return rwState{w.Val(), r.Val(), q.Val()}
}

// awaitQueued waits until n waiters are queued for the lock.
func awaitQueued(t testing.TB, rdb *redis.Client, k rwKeyNames, n int64) {
	t.Helper()
	awaitInQueue(t, rdb, k.queue, n)
}

// awaitInQueue waits until queue holds n entries and the Client of each
// listens for its messages: a queued waiter subscribes after its queueing
// call returned, and a release that finds nobody listening drops the head
// of the queue (its process is taken for gone), which then queues again at
// the back. A test of the queue's order needs its waiters listening.
func awaitInQueue(t testing.TB, rdb *redis.Client, queue string, n int64) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, fmt.Sprintf("%d waiters queued and listening", n), func() bool {
		entries := rdb.LRange(ctx, queue, 0, -1).Val()
		if int64(len(entries)) != n {
			return false
		}
		for _, e := range entries {
			// <claim>:<flag>:<wait>:<client id>:<rest of the owner>
			f := strings.SplitN(e, ":", 5)
			if len(f) < 5 || len(rdb.PubSubChannels(ctx, "*:released:"+f[3]).Val()) == 0 {
				return false
			}
		}
		return true
	})
}

// notYet fails the test if ch is closed.
func notYet(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	if isClosed(ch) {
		t.Fatalf("%s: done, want it still waiting", what)
	}
}

// TestRWMutexWriterPreferenceAcrossClients: a reader holds in one Client, a
// writer waits in another; a third Client's TryRLock says false and its
// RLock waits behind the writer, while the reader's nested RLock only
// counts. The writer gets in when the last read hold ends, the late reader
// when the writer leaves.
func TestRWMutexWriterPreferenceAcrossClients(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rws := rwClients(t, b, name, 3)
		r, w, late := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		r.do(t, hangGuard, "RLock", rws[0].RLock)
		locked := w.async(rws[1].Lock)
		awaitQueued(t, rdb, k, 1)
		var ok bool
		late.do(t, hangGuard, "TryRLock", func() { ok = rws[2].TryRLock() })
		assert.False(t, ok, "TryRLock of a third Client while a writer waits: got true, want false")
		r.do(t, hangGuard, "nested RLock and TryRLock", func() {
			rws[0].RLock()
			ok = rws[0].TryRLock()
		})
		assert.True(t, ok, "the reader's nested TryRLock while a writer waits: got false, want true (it only counts)")
		rlocked := late.async(rws[2].RLock)
		awaitQueued(t, rdb, k, 2)
		r.do(t, hangGuard, "two RUnlocks of three", func() { rws[0].RUnlock(); rws[0].RUnlock() })
		assert.Equal(t, rwState{0, 1, 2}, rwStateOf(t, rdb, k), "writers, readers, queued with one read hold left")
		notYet(t, locked, "the writer while a read hold is left")
		r.do(t, hangGuard, "RUnlock", rws[0].RUnlock)
		faultAwait(t, locked, hangGuard, "the writer once the last read hold ended")
		assert.Equal(t, rwState{1, 0, 1}, rwStateOf(t, rdb, k), "writers, readers, queued while the writer holds")
		notYet(t, rlocked, "the late reader while the writer holds")
		w.do(t, hangGuard, "Unlock", rws[1].Unlock)
		faultAwait(t, rlocked, hangGuard, "the late reader once the writer left")
		late.do(t, hangGuard, "RUnlock", rws[2].RUnlock)
		assert.Zero(t, rdb.Exists(context.Background(), k.w, k.readers, k.queue).Val(), "keys left behind")
	})
}

// TestRWMutexReadersEnterTogether: behind a writer wait three readers, a
// second writer and a fourth reader. When the first writer leaves, the
// three readers enter together (in the same script), the second writer and
// the reader behind it wait; the second writer enters when the three leave,
// the last reader when it leaves.
func TestRWMutexReadersEnterTogether(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rws := rwClients(t, b, name, 3)
		w1, w2 := newFaultGoroutine(t), newFaultGoroutine(t)
		w1.do(t, hangGuard, "Lock", rws[0].Lock)
		var readers [4]*faultGoroutine
		var rlocked [4]<-chan struct{}
		rlock := func(i int) {
			readers[i] = newFaultGoroutine(t)
			rlocked[i] = readers[i].async(rws[1+i%2].RLock)
		}
		for i := 0; i < 3; i++ {
			rlock(i)
			awaitQueued(t, rdb, k, int64(i+1))
		}
		w2locked := w2.async(rws[2].Lock)
		awaitQueued(t, rdb, k, 4)
		rlock(3)
		awaitQueued(t, rdb, k, 5)

		w1.do(t, hangGuard, "Unlock", rws[0].Unlock)
		assert.Equal(t, rwState{0, 3, 2}, rwStateOf(t, rdb, k), "writers, readers, queued right after the first writer's Unlock returned")
		for i := 0; i < 3; i++ {
			faultAwait(t, rlocked[i], hangGuard, fmt.Sprintf("reader %d once the first writer left", i))
		}
		notYet(t, w2locked, "the second writer while three readers hold")
		for i := 0; i < 3; i++ {
			readers[i].do(t, hangGuard, "RUnlock", rws[1+i%2].RUnlock)
		}
		faultAwait(t, w2locked, hangGuard, "the second writer once the three readers left")
		assert.Equal(t, rwState{1, 0, 1}, rwStateOf(t, rdb, k), "writers, readers, queued while the second writer holds")
		notYet(t, rlocked[3], "the fourth reader while the second writer holds")
		w2.do(t, hangGuard, "Unlock", rws[2].Unlock)
		faultAwait(t, rlocked[3], hangGuard, "the fourth reader once the second writer left")
		readers[3].do(t, hangGuard, "RUnlock", rws[2].RUnlock)
		assert.Zero(t, rdb.Exists(context.Background(), k.w, k.readers, k.queue).Val(), "keys left behind")
	})
}

// TestRWMutexDowngradeSeenByOthers: a writer that took a read hold too
// unlocks the write: a reader of another Client that waited enters, a writer
// of a third that queued after it still waits for both read holds. The
// readers' Fence is the downgraded write's token.
func TestRWMutexDowngradeSeenByOthers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rws := rwClients(t, b, name, 3, WithFencing())
		g, r, w := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		var fence int64
		g.do(t, hangGuard, "Lock and RLock", func() {
			rws[0].Lock()
			rws[0].RLock()
			fence = rws[0].Fence()
		})
		rlocked := r.async(rws[1].RLock)
		awaitQueued(t, rdb, k, 1)
		wlocked := w.async(rws[2].Lock)
		awaitQueued(t, rdb, k, 2)

		var downgraded int64
		g.do(t, hangGuard, "Unlock", func() {
			rws[0].Unlock()
			downgraded = rws[0].Fence()
		})
		assert.Equal(t, fence, downgraded, "Fence of the read hold kept by the downgrade")
		faultAwait(t, rlocked, hangGuard, "the waiting reader once the writer downgraded")
		assert.Equal(t, rwState{0, 2, 1}, rwStateOf(t, rdb, k), "writers, readers, queued after the downgrade")
		assert.Equal(t, fence, rws[1].lockFence(r, t), "Fence of the reader that entered after the downgrade")
		g.do(t, hangGuard, "RUnlock", rws[0].RUnlock)
		notYet(t, wlocked, "the writer while the other reader holds")
		r.do(t, hangGuard, "RUnlock", rws[1].RUnlock)
		faultAwait(t, wlocked, hangGuard, "the writer once both read holds ended")
		assert.Greater(t, rws[2].lockFence(w, t), fence, "the next writer's Fence")
		w.do(t, hangGuard, "Unlock", rws[2].Unlock)
	})
}

// TestRWMutexUpgrade: a goroutine that holds only read holds and asks for
// the write lock is told at once, without a command sent, and keeps its read
// holds; a goroutine that holds the write lock and a read hold may Lock
// again.
func TestRWMutexUpgrade(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		cmds := newCommandLog()
		rdb := b.rdb(t)
		rdb.AddHook(cmds)
		rw, other := clientOn(t, rdb).NewRWMutex(name), b.client(t).NewRWMutex(name)
		g, o := newFaultGoroutine(t), newFaultGoroutine(t)
		g.do(t, hangGuard, "RLock twice", func() { rw.RLock(); rw.RLock() })
		start := time.Now()
		var lerr, terr error
		var tok, tryOK bool
		var p interface{}
		g.do(t, hangGuard, "upgrades", func() {
			lerr = rw.LockContext(context.Background())
			tok, terr = rw.TryLockContext(context.Background())
			tryOK = rw.TryLock()
			p = faultPanic(rw.Lock)
		})
		assert.ErrorIs(t, lerr, ErrUpgrade, "LockContext")
		assert.ErrorContains(t, lerr, name, "LockContext's error names the lock")
		assert.False(t, tok, "TryLockContext: got true")
		assert.ErrorIs(t, terr, ErrUpgrade, "TryLockContext")
		assert.False(t, tryOK, "TryLock: got true")
		if err, ok := p.(error); assert.True(t, ok, "Lock panicked with %v, want an error", p) {
			assert.ErrorIs(t, err, ErrUpgrade, "Lock's panic")
			assert.True(t, strings.HasPrefix(err.Error(), "remutex: ") && strings.Contains(err.Error(), "upgrade would deadlock"),
				"Lock panicked with %q, want a \"remutex: \" message that says why", err)
		}
		assert.Empty(t, cmds.since(start), "commands sent by the upgrades")

		var ok bool
		o.do(t, hangGuard, "TryLock", func() { ok = other.TryLock() })
		assert.False(t, ok, "another Client's TryLock: got true, want false (the read holds are kept)")
		g.do(t, hangGuard, "RUnlock twice", func() { rw.RUnlock(); rw.RUnlock() })
		g.do(t, hangGuard, "Lock, RLock, Lock, TryLock", func() {
			rw.Lock()
			rw.RLock()
			lerr = rw.LockContext(context.Background())
			ok = rw.TryLock()
		})
		assert.NoError(t, lerr, "LockContext of a goroutine that holds the write and a read hold")
		assert.True(t, ok, "TryLock of a goroutine that holds the write and a read hold")
		g.do(t, hangGuard, "unlock all", func() { rw.Unlock(); rw.Unlock(); rw.RUnlock(); rw.Unlock() })
		o.do(t, hangGuard, "TryLock", func() { ok = other.TryLock() })
		assert.True(t, ok, "another Client's TryLock after all holds ended")
		o.do(t, hangGuard, "Unlock", other.Unlock)
	})
}

// TestRWMutexMisusePanics: RUnlock and Unlock without the matching hold
// panic like sync's, whatever else the goroutine holds, and leave the holds
// of the lock as they were.
func TestRWMutexMisusePanics(t *testing.T) {
	const runlock, unlock = "remutex: RUnlock of unlocked DistRWMutex", "remutex: Unlock of unlocked DistRWMutex"
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rw := b.client(t).NewRWMutex(name)
		reader, writer, other := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		check := func(g *faultGoroutine, what string, f func(), want string) {
			t.Helper()
			var p interface{}
			g.do(t, hangGuard, what, func() { p = faultPanic(f) })
			assert.True(t, strings.HasPrefix(fmt.Sprint(p), want), "%s: panic %v, want it to begin %q", what, p, want)
		}
		check(other, "RUnlock of nothing", rw.RUnlock, runlock)
		check(other, "Unlock of nothing", rw.Unlock, unlock)
		reader.do(t, hangGuard, "RLock", rw.RLock)
		check(reader, "Unlock by a reader", rw.Unlock, unlock)
		check(other, "RUnlock by another goroutine than the reader", rw.RUnlock, runlock)
		assert.Equal(t, rwState{0, 1, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after the misuses")
		reader.do(t, hangGuard, "RUnlock", rw.RUnlock)
		writer.do(t, hangGuard, "Lock", rw.Lock)
		check(writer, "RUnlock by a writer", rw.RUnlock, runlock)
		check(other, "Unlock by another goroutine than the writer", rw.Unlock, unlock)
		assert.Equal(t, rwState{1, 0, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after the misuses")
		writer.do(t, hangGuard, "Unlock", rw.Unlock)
	})
}

// TestRWMutexNonReentrant: with NonReentrant the holds belong to the value,
// as with sync.RWMutex: any goroutine may RUnlock or Unlock, a nested RLock
// is another hold (the writer waits for both), a nested RLock behind a
// waiting writer waits, and so does an upgrade; the waits that give up
// leave nothing behind.
func TestRWMutexNonReentrant(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rw := b.client(t).NewRWMutex(name, NonReentrant())
		other := b.client(t).NewRWMutex(name)
		g, h, w := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		g.do(t, hangGuard, "RLock twice", func() { rw.RLock(); rw.RLock() })
		assert.Equal(t, rwState{0, 2, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after two RLocks")
		var err error
		g.do(t, hangGuard, "upgrade", func() { err = rw.LockContext(testCtx(t, 200*time.Millisecond)) })
		assert.ErrorIs(t, err, context.DeadlineExceeded, "LockContext of a reader (it waits for itself)")
		settled(t, rw.w.c)
		assert.Equal(t, rwState{0, 2, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after the upgrade gave up")
		wlocked := w.async(other.Lock)
		awaitQueued(t, rdb, k, 1)
		g.do(t, hangGuard, "nested RLock behind the writer", func() { err = rw.RLockContext(testCtx(t, 200*time.Millisecond)) })
		assert.ErrorIs(t, err, context.DeadlineExceeded, "a third RLock while a writer waits")
		settled(t, rw.w.c)
		assert.Equal(t, rwState{0, 2, 1}, rwStateOf(t, rdb, k), "writers, readers, queued after it gave up")
		h.do(t, hangGuard, "RUnlock by another goroutine", rw.RUnlock)
		assert.Equal(t, int64(1), rdb.ZCard(context.Background(), k.readers).Val(), "read holds after one RUnlock")
		notYet(t, wlocked, "the writer while one read hold is left")
		h.do(t, hangGuard, "RUnlock by another goroutine", rw.RUnlock)
		faultAwait(t, wlocked, hangGuard, "the writer once both read holds ended")
		w.do(t, hangGuard, "Unlock", other.Unlock)

		g.do(t, hangGuard, "Lock", rw.Lock)
		h.do(t, hangGuard, "Unlock by another goroutine", rw.Unlock)
		var ok bool
		w.do(t, hangGuard, "TryLock", func() { ok = other.TryLock() })
		assert.True(t, ok, "another Client's TryLock after the Unlock")
		w.do(t, hangGuard, "Unlock", other.Unlock)
		assert.Zero(t, rdb.Exists(context.Background(), k.w, k.readers, k.queue).Val(), "keys left behind")
	})
}

// failAfterFirst is a hook that lets calls of script through until one
// succeeded, and fails every later one with a network error, without
// sending it. It counts the calls it failed.
func failAfterFirst(script string) (redis.Hook, *atomic.Int64) {
	var ok atomic.Bool // a call of script succeeded
	var failed atomic.Int64
	run := func(cmds []redis.Cmder, next func() error) error {
		mine := false
		for _, cmd := range cmds {
			if s, _ := scriptCall(cmd); s == script && !quickCall(cmd) { // those never queue
				mine = true
			}
		}
		if !mine {
			return next()
		}
		if ok.Load() {
			failed.Add(1)
			for _, cmd := range cmds {
				cmd.SetErr(transientErr())
			}
			return transientErr()
		}
		err := next()
		ok.Store(err == nil)
		return err
	}
	return hookFuncs{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			return run([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			return run(cmds, func() error { return next(ctx, cmds) })
		},
	}, &failed
}

// TestRWMutexWokenByMessage: a writer waiting for the last reader, and a
// reader waiting for a writer, get the lock from the release's message.
// Every call of the waiter after the one that queued it fails (its entry
// stays alive for 750ms without refreshes), so no timer or refresh can give
// it the lock: without the message it would wait forever.
func TestRWMutexWokenByMessage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string // the waiter's
	}{{"WriterAfterLastReader", "wlock"}, {"ReaderAfterWriter", "rlock"}} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b *testBackend) {
				name := lockName(t)
				k, rdb := rwKeysOf(name), b.rdb(t)
				holder := b.client(t).NewRWMutex(name, WithLease(time.Minute))
				hook, failed := failAfterFirst(tc.script)
				wrdb := b.rdb(t)
				wrdb.AddHook(hook)
				waiter := clientOn(t, wrdb).NewRWMutex(name, WithLease(time.Minute))
				hg, wg := newFaultGoroutine(t), newFaultGoroutine(t)
				hold, release, wait, home := holder.RLock, holder.RUnlock, waiter.Lock, k.w
				if tc.script == "rlock" {
					hold, release, wait, home = holder.Lock, holder.Unlock, waiter.RLock, k.readers
				}
				hg.do(t, hangGuard, "hold", hold)
				locked := wg.async(wait)
				awaitQueued(t, rdb, k, 1)
				faultSubscribed(t, rdb, home+releasedInfix)
				hg.do(t, hangGuard, "release", release)
				faultAwait(t, locked, 5*time.Second, "the waiter, by the release's message")
				t.Logf("%d calls of %s failed after the one that queued the waiter", failed.Load(), tc.script)
				if tc.script == "rlock" {
					wg.do(t, hangGuard, "RUnlock", waiter.RUnlock)
				} else {
					wg.do(t, hangGuard, "Unlock", waiter.Unlock)
				}
			})
		})
	}
}

// TestRWMutexCancelLeavesNothing: a writer and a reader that give up while
// queued leave no queue entry and no hold; the reader queued behind a
// writer that gave up enters at once, by the message of the writer's leave
// (its own calls after queueing fail).
func TestRWMutexCancelLeavesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		rws := rwClients(t, b, name, 3)
		hook, _ := failAfterFirst("rlock")
		lrdb := b.rdb(t)
		lrdb.AddHook(hook)
		lrw := clientOn(t, lrdb).NewRWMutex(name)
		r, w, late := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		r.do(t, hangGuard, "RLock", rws[0].RLock)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var werr error
		wdone := w.async(func() { werr = rws[1].LockContext(ctx) })
		awaitQueued(t, rdb, k, 1)
		rlocked := late.async(lrw.RLock)
		awaitQueued(t, rdb, k, 2)
		faultSubscribed(t, rdb, k.readers+releasedInfix)
		cancel()
		faultAwait(t, wdone, hangGuard, "the writer's LockContext once cancelled")
		assert.ErrorIs(t, werr, context.Canceled, "the writer's LockContext")
		faultAwait(t, rlocked, 5*time.Second, "the reader behind the writer that gave up")
		assert.Equal(t, rwState{0, 2, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after the writer gave up")
		late.do(t, hangGuard, "RUnlock", lrw.RUnlock)

		r.do(t, hangGuard, "RUnlock", rws[0].RUnlock)
		w.do(t, hangGuard, "Lock", rws[1].Lock)
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		var rerr error
		rdone := late.async(func() { rerr = rws[2].RLockContext(ctx) })
		awaitQueued(t, rdb, k, 1)
		cancel()
		faultAwait(t, rdone, hangGuard, "the reader's RLockContext once cancelled")
		assert.ErrorIs(t, rerr, context.Canceled, "the reader's RLockContext")
		settled(t, rws[2].r.c)
		assert.Equal(t, rwState{1, 0, 0}, rwStateOf(t, rdb, k), "writers, readers, queued after the reader gave up")
		w.do(t, hangGuard, "Unlock", rws[1].Unlock)
		assert.Zero(t, rdb.Exists(context.Background(), k.w, k.readers, k.queue).Val(), "keys left behind")
	})
}

// TestRWMutexIndependentOfMutex: a DistMutex and a DistRWMutex of the same
// name are different locks: each is taken while the other is held, and
// neither touches the other's keys.
func TestRWMutexIndependentOfMutex(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := context.Background()
		k, mk, rdb := rwKeysOf(name), keysOf(name), b.rdb(t)
		m := b.client(t).NewMutex(name)
		rw := b.client(t).NewRWMutex(name)
		g, h := newFaultGoroutine(t), newFaultGoroutine(t)
		var ok bool
		g.do(t, hangGuard, "Lock the mutex", m.Lock)
		h.do(t, hangGuard, "TryLock the RW mutex", func() { ok = rw.TryLock() })
		assert.True(t, ok, "the RW mutex's TryLock while the mutex is held")
		g.do(t, hangGuard, "TryLock the mutex again", func() { ok = b.client(t).NewMutex(name).TryLock() })
		assert.False(t, ok, "another Client's TryLock of the held mutex")
		assert.Equal(t, int64(1), rdb.Exists(ctx, mk.hash).Val(), "the mutex's hash")
		assert.Equal(t, int64(1), rdb.HLen(ctx, k.w).Val(), "the RW mutex's writers")
		g.do(t, hangGuard, "Unlock the mutex", m.Unlock)
		assert.Equal(t, int64(1), rdb.HLen(ctx, k.w).Val(), "the RW mutex's writers after the mutex's Unlock")
		h.do(t, hangGuard, "Unlock, RLock", func() { rw.Unlock(); rw.RLock() })
		g.do(t, hangGuard, "Lock the mutex while read-held", m.Lock)
		g.do(t, hangGuard, "Unlock the mutex", m.Unlock)
		h.do(t, hangGuard, "RUnlock", rw.RUnlock)
	})
}

// TestRWMutexWrongType: a key of another type at any of a read/write lock's
// keys makes every way to take it, for reading or writing, return a
// WrongTypeError naming the key, and leaves the data as it was, with no
// other key written.
func TestRWMutexWrongType(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := context.Background()
		rdb := b.rdb(t)
		c := b.client(t)
		str := func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }
		list := func(key string) error { return rdb.RPush(ctx, key, "precious").Err() }
		cases := []struct {
			name  string
			key   func(rwKeyNames) string
			plant func(key string) error
			typ   string
		}{
			{"string at the writers key", func(k rwKeyNames) string { return k.w }, str, "string"},
			{"string at the readers key", func(k rwKeyNames) string { return k.readers }, str, "string"},
			{"string at the queue key", func(k rwKeyNames) string { return k.queue }, str, "string"},
			{"list at the fence key", func(k rwKeyNames) string { return k.fence }, list, "list"},
			{"non-integer fence", func(k rwKeyNames) string { return k.fence }, str, "non-integer"},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				name := fmt.Sprintf("%s.%d", lockName(t), i)
				k := rwKeysOf(name)
				key := tc.key(k)
				require.NoError(t, tc.plant(key))
				before := rwContent(t, rdb, key)
				rw := c.NewRWMutex(name, WithFencing())
				check := func(what string, err error) {
					t.Helper()
					var wt *WrongTypeError
					if assert.ErrorAs(t, err, &wt, what) {
						assert.Equal(t, key, wt.Key, "%s: WrongTypeError.Key", what)
						assert.Equal(t, tc.typ, wt.Type, "%s: WrongTypeError.Type", what)
					}
				}
				check("LockContext", rw.LockContext(ctx))
				check("RLockContext", rw.RLockContext(ctx))
				ok, err := rw.TryLockContext(ctx)
				assert.False(t, ok, "TryLockContext: got true")
				check("TryLockContext", err)
				ok, err = rw.TryRLockContext(ctx)
				assert.False(t, ok, "TryRLockContext: got true")
				check("TryRLockContext", err)
				assert.Equal(t, before, rwContent(t, rdb, key), "the data at %s", key)
				assert.Equal(t, time.Duration(-1), rdb.TTL(ctx, key).Val(), "the TTL of %s", key)
				for _, other := range k.all() {
					if other != key {
						assert.Zero(t, rdb.Exists(ctx, other).Val(), "stray key %s", other)
					}
				}
			})
		}
	})
}

// rwContent returns the type and value of a string or list key.
func rwContent(t testing.TB, rdb *redis.Client, key string) []string {
	t.Helper()
	ctx := context.Background()
	typ, err := rdb.Type(ctx, key).Result()
	require.NoError(t, err)
	var v []string
	if typ == "list" {
		v, err = rdb.LRange(ctx, key, 0, -1).Result()
	} else {
		var s string
		s, err = rdb.Get(ctx, key).Result()
		v = []string{s}
	}
	require.NoError(t, err)
	return append([]string{typ}, v...)
}

// TestRWMutexWatchdogBatchesReadHolds: 1000 read holds of one Client (a
// NonReentrant value: each RLock another hold) are renewed in renew calls
// of up to 500 holds, in one pipelined round trip per renewal window, not
// in 1000 calls. (All holds fall in one window if the RLocks take less than
// a sixth of the lease; on a slow machine they may take two.) On miniredis,
// whose scripts are slow (see TestHammer), 250 holds.
func TestRWMutexWatchdogBatchesReadHolds(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		const lease = 9 * time.Second // renewed every 3s
		holds := 1000
		if !b.real() {
			holds = 250
		}
		name := lockName(t)
		k := rwKeysOf(name)
		rec := newRenewRecorder()
		rdb := b.rdb(t)
		rdb.AddHook(rec.hook())
		rw := clientOn(t, rdb).NewRWMutex(name, WithLease(lease), NonReentrant())
		start := time.Now()
		for i := 0; i < holds; i++ {
			rw.RLock()
		}
		took := time.Since(start)
		t.Logf("%d RLocks took %v", holds, took)
		assert.Equal(t, int64(holds), b.rdb(t).ZCard(context.Background(), k.readers).Val(), "read holds in Redis")
		renewed := func() (n int) {
			for _, p := range rec.pipelines() {
				for _, keys := range p {
					n += len(keys)
				}
			}
			return n
		}
		for renewed() < holds {
			await(t, rec.seen, "a renewal")
		}
		// Holds taken within one renewal window (lease/6) of each other are
		// renewed in one round trip: those taken over the RLocks' time fall
		// in at most took/window + 2 round trips (2 when the RLocks are
		// quick, as on a quiet machine). Each
		// round trip's holds go in as few calls of at most 500 as they fit
		// in, however they fell.
		ps := rec.pipelines()
		assert.LessOrEqual(t, len(ps), int(took/(lease/6))+2, "renewal round trips until every hold was renewed, the RLocks having taken %v", took)
		calls := 0
		for _, p := range ps {
			inTrip := 0
			for _, keys := range p {
				calls++
				inTrip += len(keys)
				assert.LessOrEqual(t, len(keys), 500, "holds renewed by one call")
				for _, key := range keys {
					if key != k.readers {
						t.Fatalf("a renew call renews %s, want only %s", key, k.readers)
					}
				}
			}
			assert.Equal(t, (inTrip+499)/500, len(p), "renew calls of a round trip that renewed %d holds", inTrip)
		}
		t.Logf("%d holds renewed by %d calls in %d round trips", renewed(), calls, len(ps))
		assert.False(t, isClosed(rw.Lost()), "Lost after the renewal")
		for i := 0; i < holds; i++ {
			rw.RUnlock()
		}
	})
}

// TestRWMutexLostOnFlushAll: FLUSHALL ends every hold: the watchdog finds
// the read holds (of two goroutines, one also nested) and the write hold
// gone, Lost closes for each, the error handler hears of each, and their
// unlocks report ErrLockLost, nested ones too.
func TestRWMutexLostOnFlushAll(t *testing.T) {
	eachFreshBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		const lease = 300 * time.Millisecond
		c, errs := clientWithErrors(t, b.rdb(t))
		rw := c.NewRWMutex(name, WithLease(lease))
		wrw := c.NewRWMutex(name+".w", WithLease(lease))
		r1, r2, w := newFaultGoroutine(t), newFaultGoroutine(t), newFaultGoroutine(t)
		var lost [3]<-chan struct{}
		r1.do(t, hangGuard, "RLock twice", func() { rw.RLock(); rw.RLock(); lost[0] = rw.Lost() })
		r2.do(t, hangGuard, "RLock", func() { rw.RLock(); lost[1] = rw.Lost() })
		w.do(t, hangGuard, "Lock", func() { wrw.Lock(); lost[2] = wrw.Lost() })
		for i, l := range lost {
			require.False(t, isClosed(l), "Lost %d closed before the FLUSHALL", i)
		}
		require.NoError(t, b.rdb(t).FlushAll(context.Background()).Err())
		for i, l := range lost {
			await(t, l, fmt.Sprintf("Lost %d to close after the FLUSHALL", i))
		}
		waitFor(t, "the error handler to hear of three losses", func() bool { return errs.count(ErrLockLost) >= 3 })
		var e1, e2, e3, e4 error
		r1.do(t, hangGuard, "RUnlockContext twice", func() {
			e1 = rw.RUnlockContext(context.Background())
			e2 = rw.RUnlockContext(context.Background())
		})
		r2.do(t, hangGuard, "RUnlockContext", func() { e3 = rw.RUnlockContext(context.Background()) })
		w.do(t, hangGuard, "UnlockContext", func() { e4 = wrw.UnlockContext(context.Background()) })
		for i, err := range []error{e1, e2, e3, e4} {
			assert.ErrorIs(t, err, ErrLockLost, "unlock %d after the FLUSHALL", i)
		}
		var ok bool
		r2.do(t, hangGuard, "TryLock", func() { ok = rw.TryLock() })
		assert.True(t, ok, "TryLock after the lost holds were unlocked")
		r2.do(t, hangGuard, "Unlock", rw.Unlock)
	})
}
