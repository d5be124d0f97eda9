package remutex

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Tests of the uncontended cycle (quick.go): its final release is a plain
// HDEL (ZREM) with an EXISTS of the queue, and a release that finds
// somebody queued (a waiter of another Client, which the releasing Client
// has not seen contended) passes the lock on with wake.lua (rwwake.lua).

// TestQuickReleaseWakesTheQueue: a holder whose Client saw no contention
// releases with HDEL; the waiter of another Client queued meanwhile is handed
// the lock by the wake script that follows, long before its queue refresh
// or the holder's lease would have woken it.
func TestQuickReleaseWakesTheQueue(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		cmds := newCommandLog()
		hrdb := b.rdb(t)
		hrdb.AddHook(cmds)
		holder := clientOn(t, hrdb).NewMutex(name)
		waiter := b.client(t).NewMutex(name)
		k := keysOf(name)
		rdb := b.rdb(t)
		ctx := testCtx(t, hangGuard)

		h := holdIn(t, holder)
		locked := make(chan struct{}, 1)
		go func() {
			if err := waiter.LockContext(ctx); err != nil {
				t.Errorf("waiter: %v", err)
			}
			locked <- struct{}{}
			_ = waiter.UnlockContext(ctx)
		}()
		awaitInQueue(t, rdb, k.queue, 1)
		start := time.Now()
		h.release()
		if err := await(t, h.unlocked, "the holder's UnlockContext"); err != nil {
			t.Fatalf("holder's UnlockContext: %v", err)
		}
		await(t, locked, "the waiter")
		var sent []string
		for _, c := range cmds.since(start) {
			sent = append(sent, strings.ToLower(fmt.Sprint(c.args[0])))
			if name, _ := scriptCallArgs(c.args); name != "" {
				sent = append(sent, name)
			}
		}
		got := strings.Join(sent, " ")
		if !strings.Contains(got, "hdel") || !strings.Contains(got, "exists") || !strings.Contains(got, "wake") {
			t.Errorf("the holder's release sent %q, want HDEL, EXISTS, then wake.lua", got)
		}
	})
}

// TestQuickReadReleaseWakesTheWriter: the last reader's plain ZREM finds a
// writer queued; rwwake.lua lets it in.
func TestQuickReadReleaseWakesTheWriter(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		cmds := newCommandLog()
		rrdb := b.rdb(t)
		rrdb.AddHook(cmds)
		reader := clientOn(t, rrdb).NewRWMutex(name)
		writer := b.client(t).NewRWMutex(name)
		k, rdb := rwKeysOf(name), b.rdb(t)
		ctx := testCtx(t, hangGuard)
		r := newFaultGoroutine(t)
		r.do(t, hangGuard, "RLock", reader.RLock)
		wrote := make(chan error, 1)
		go func() {
			err := writer.LockContext(ctx)
			if err == nil {
				err = writer.UnlockContext(ctx)
			}
			wrote <- err
		}()
		awaitQueued(t, rdb, k, 1)
		var err error
		r.do(t, hangGuard, "RUnlock", func() { err = reader.RUnlockContext(ctx) })
		if err != nil {
			t.Fatalf("RUnlockContext: %v", err)
		}
		if err := await(t, wrote, "the writer"); err != nil {
			t.Errorf("the writer after the last reader left: %v", err)
		}
		woke := false
		for _, c := range cmds.since(time.Time{}) {
			if name, _ := scriptCallArgs(c.args); name == "rwwake" {
				woke = true
			}
		}
		if !woke {
			t.Errorf("the last reader's release sent no rwwake.lua, which lets the queued writer in")
		}
	})
}

// TestReadAfterPlainZremLeavesWriterFirst: the last reader's plain ZREM
// leaves the lock free with a writer at the head of the queue until its
// rwwake.lua runs. A reader that comes in between must not enter beside the
// writer that its own call hands the lock to: it waits behind it.
func TestReadAfterPlainZremLeavesWriterFirst(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k, rdb := rwKeysOf(name), b.rdb(t)
		ctx := testCtx(t, hangGuard)
		first := b.client(t).NewRWMutex(name)
		r := newFaultGoroutine(t)
		r.do(t, hangGuard, "RLock", first.RLock)
		writer := b.client(t).NewRWMutex(name)
		w := newFaultGoroutine(t)
		var err error
		locked := w.async(func() { err = writer.LockContext(ctx) })
		awaitQueued(t, rdb, k, 1)
		// The reader's ZREM, without the wake that follows it.
		if err := rdb.Del(ctx, k.readers).Err(); err != nil {
			t.Fatal(err)
		}
		if b.client(t).NewRWMutex(name).TryRLock() {
			t.Errorf("TryRLock with a writer at the head of a free lock: got true, want false (it is handed to the writer)")
		}
		faultAwait(t, locked, hangGuard, "the writer")
		if err != nil {
			t.Fatalf("the writer: %v", err)
		}
		w.do(t, hangGuard, "Unlock", writer.Unlock)
	})
}
