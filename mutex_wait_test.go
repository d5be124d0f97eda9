package remutex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/remutex/remutex/internal/redistest"
)

// Waiting: release messages, the hand-off queue in Redis,
// waiting without a message, and giving up.

// watchdogHolds returns how many holds c's watchdog renews.
func watchdogHolds(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.wd.holds)
}

// serverMillis returns the server's clock in milliseconds (TIME).
func serverMillis(t testing.TB, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	return now.UnixMilli()
}

// queueEntry is the form of an entry of a lock's queue:
// <claim ms>:<flag>:<wait id>.<arrival ms>:<owner token>.
var queueEntry = regexp.MustCompile(`^(\d+):([01]):(\d+)-\d+\.(\d+):([A-Za-z0-9_-]{22}\.[A-Za-z0-9._-]+\.\d+):(\d+\.\d+)$`)

// TestReleasePublishes: a release publishes only when someone waits, and
// then one message, on the waiting Client's own channel of the lock.
func TestReleasePublishes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		ps := rdb.PSubscribe(ctx, k.channel+"*")
		t.Cleanup(func() { _ = ps.Close() })
		_, err := ps.Receive(ctx) // the subscription's confirmation
		require.NoError(t, err)
		msgs := ps.Channel()
		marker := func(s string) {
			t.Helper()
			require.NoError(t, rdb.Publish(ctx, k.channel+"marker", s).Err())
		}

		m := b.client(t).NewMutex(name)
		m.Lock()
		m.Lock()
		m.Unlock()
		m.Unlock()
		// A marker published now arrives after anything the Unlocks published.
		marker("1")
		assert.Equal(t, "1", await(t, msgs, "the marker").Payload, "first message: an Unlock without waiters must not publish")

		// A waiter's own refresh may find the lock free before the queue
		// hands it over (between a quick release's HDEL and the wake that
		// follows it, or after its entry lapsed on a stalled machine), and
		// then nothing is published: a round where that happened is tried
		// again, and the queue must hand it over in one of a few. (What the
		// waiter heard does not tell: its refresh may take a grant before
		// the grant's message reaches it.)
		wc := b.client(t)
		for round := 1; ; round++ {
			m.Lock()
			w := goLock(t, wc.NewMutex(name))
			awaitInQueue(t, rdb, k.queue, 1)
			m.Unlock()
			require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
			marker("2")
			var heard []*redis.Message
			for msg := await(t, msgs, "the marker"); msg.Channel != k.channel+"marker"; msg = await(t, msgs, "the marker") {
				heard = append(heard, msg)
			}
			require.LessOrEqual(t, len(heard), 1, "one message per release, got %v", heard)
			for _, msg := range heard {
				assert.Equal(t, k.channel+wc.id, msg.Channel, "channel of the release message")
				assert.Regexp(t, `^(w|g \d+) `, msg.Payload, "release message")
			}
			w.release()
			require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
			marker("3")
			assert.Equal(t, "3", await(t, msgs, "the marker").Payload, "an Unlock without waiters must not publish")
			if len(heard) == 1 {
				return
			}
			if round == 5 {
				t.Fatalf("in %d rounds the queue never handed the lock to the waiter", round)
			}
		}
	})
}

// TestQueueGrantsInOrder: waiters join the queue in Redis, in arrival
// order, keeping it from expiring while they wait, and the lock is handed to
// them in arrival order, within one Client and across Clients.
func TestQueueGrantsInOrder(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		for _, tc := range []struct {
			name    string
			clients int
		}{{"one client", 1}, {"four clients", 4}} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				k := keysOf(name)
				ctx := context.Background()
				rdb := b.rdb(t)
				holder := b.client(t).NewMutex(name)
				holder.Lock()
				started := time.Now()
				var clients []*Client
				for i := 0; i < tc.clients; i++ {
					clients = append(clients, b.client(t))
				}

				const n = 4
				got := make(chan int, n)
				errc := make(chan error, n)
				release := make([]chan struct{}, n)
				wctx, cancel := context.WithCancel(ctx)
				var wg sync.WaitGroup
				t.Cleanup(func() {
					cancel()
					for _, r := range release {
						select {
						case <-r:
						default:
							close(r)
						}
					}
					wg.Wait()
				})
				for i := 0; i < n; i++ {
					release[i] = make(chan struct{})
					m := clients[i%tc.clients].NewMutex(name)
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := m.LockContext(wctx); err != nil {
							errc <- err
							return
						}
						got <- i
						<-release[i]
						m.Unlock()
					}()
					waitFor(t, fmt.Sprintf("waiter %d in the queue", i), func() bool { return rdb.LLen(ctx, k.queue).Val() == int64(i+1) })
				}

				// The queue: entries in arrival order, naming their owners and
				// their arrival on their own Client's clock.
				entries, err := rdb.LRange(ctx, k.queue, 0, -1).Result()
				require.NoError(t, err)
				require.Len(t, entries, n)
				var last int64
				for i, e := range entries {
					parts := queueEntry.FindStringSubmatch(e)
					if assert.NotNil(t, parts, "queue entry %q: want <claim ms>:<flag>:<wait id>-<sent>.<arrival ms>:<owner>", e) {
						assert.Equal(t, clients[i%tc.clients].id, parts[5], "owner's client of queue entry %d", i)
						arrival, _ := strconv.ParseInt(parts[4], 10, 64)
						assert.True(t, arrival >= started.UnixMilli() && arrival <= time.Now().UnixMilli() && arrival >= last,
							"arrival of queue entry %d: %d, want in [%d, now], not before the one ahead (%d)", i, arrival, started.UnixMilli(), last)
						last = arrival
					}
				}
				// The waiters keep the queue from expiring while they wait.
				pttl := rdb.PTTL(ctx, k.queue).Val()
				assert.True(t, pttl > 0 && pttl <= maxQueueTTL, "queue PTTL %v, want (0, %v]", pttl, maxQueueTTL)
				require.NoError(t, rdb.PExpire(ctx, k.queue, maxQueueTTL*2/3).Err())
				waitFor(t, "the queue's TTL to be raised again", func() bool { return rdb.PTTL(ctx, k.queue).Val() > maxQueueTTL*2/3 })
				awaitInQueue(t, rdb, k.queue, n) // and listening: a head not listening is dropped

				holder.Unlock()
				for want := 0; want < n; want++ {
					select {
					case i := <-got:
						require.Equal(t, want, i, "waiter granted the lock")
						close(release[i])
					case err := <-errc:
						t.Fatalf("waiter: %v", err)
					case <-time.After(hangGuard):
						t.Fatalf("got no grant after %v, want waiter %d", hangGuard, want)
					}
				}
				wg.Wait()
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left behind")
			})
		}
	})
}

// TestTryLockDoesNotBarge: while a waiter is owed the lock, TryLock of a free
// lock fails (the lock goes to the queue's head) and leaves nothing behind.
func TestTryLockDoesNotBarge(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		holder := b.client(t).NewMutex(name, WithLease(600*time.Millisecond))
		holder.Lock()
		holderLost := holder.Lost()
		wc := b.client(t)
		w := goLock(t, wc.NewMutex(name))
		// Queued and listening: a head whose Client does not listen is
		// dropped (its process looks gone), and the lock is free to take.
		awaitInQueue(t, rdb, k.queue, 1)

		// The holder's key vanishes without a release message: the lock is free
		// but a waiter is queued, and it is owed the lock.
		require.NoError(t, rdb.Del(ctx, k.hash).Err())
		bc := b.client(t)
		barger := bc.NewMutex(name)
		assert.False(t, barger.TryLock(), "TryLock with a waiter queued: got true, want false")
		ok, err := barger.TryLockContext(ctx)
		assert.False(t, ok, "TryLockContext with a waiter queued: got true, want false")
		assert.NoError(t, err)
		assert.Equal(t, 0, barger.HoldCount())

		require.NoError(t, await(t, w.locked, "the queued waiter to get the lock"))
		for _, e := range rdb.LRange(ctx, k.queue, 0, -1).Val() {
			assert.NotContains(t, e, bc.id, "queue entry of the TryLock caller")
		}
		fields := rdb.HKeys(ctx, k.hash).Val()
		if assert.Len(t, fields, 1, "holds in Redis") {
			assert.True(t, strings.HasPrefix(fields[0], wc.id+":"), "holder in Redis: got %s, want the waiter's client %s", fields[0], wc.id)
		}
		assert.Equal(t, 0, watchdogHolds(bc), "holds renewed by the TryLock caller's Client")

		await(t, holderLost, "the old holder's Lost to close")
		assert.ErrorIs(t, holder.UnlockContext(ctx), ErrLockLost)
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
	})
}

// TestWaiterGetsInWithoutReleaseMessage: a lock that ends without a release
// message (its key deleted behind the holder's back, or its fixed lease run
// out) still goes to a waiter.
func TestWaiterGetsInWithoutReleaseMessage(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		const fixed = 300 * time.Millisecond
		for _, tc := range []struct {
			name   string
			opts   []MutexOption
			vanish func(t *testing.T, rdb *redis.Client, k lockKeyNames)
		}{
			{
				name: "key deleted",
				opts: []MutexOption{WithLease(3 * time.Second)},
				vanish: func(t *testing.T, rdb *redis.Client, k lockKeyNames) {
					require.NoError(t, rdb.Del(context.Background(), k.hash).Err())
				},
			},
			{
				name:   "lease run out",
				opts:   []MutexOption{WithLease(fixed), WithoutRenewal()},
				vanish: func(t *testing.T, rdb *redis.Client, k lockKeyNames) { b.fastForward(fixed) },
			},
		} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				k := keysOf(name)
				ctx := context.Background()
				rdb := b.rdb(t)
				holder := b.client(t).NewMutex(name, tc.opts...)
				holder.Lock()
				lost := holder.Lost()
				w := goLock(t, b.client(t).NewMutex(name))
				waitFor(t, "the waiter in the queue", func() bool { return rdb.LLen(ctx, k.queue).Val() == 1 })
				tc.vanish(t, rdb, k)

				require.NoError(t, await(t, w.locked, "the waiter to get the lock"))
				await(t, lost, "the holder's Lost to close")
				assert.ErrorIs(t, holder.UnlockContext(ctx), ErrLockLost)
				w.release()
				require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
			})
		}
	})
}

// TestDeadQueueEntry: a queue entry whose waiter is gone delays the lock at
// most by its claim window: skipped at once when no Client listens for it
// (its process died), and granted only a claim lease (not the full lease)
// when its Client listens but nobody waits in it.
func TestDeadQueueEntry(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		const claim = time.Second
		for _, tc := range []struct {
			name   string
			listen bool // a connection subscribes to the dead entry's channel
		}{{"nobody listens", false}, {"its Client listens", true}} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				k := keysOf(name)
				ctx := context.Background()
				rdb := b.rdb(t)
				holder := b.client(t).NewMutex(name)
				holder.Lock()

				deadID := strings.Repeat("d", 22) + ".host.1"
				deadOwner := deadID + ":1"
				dead := fmt.Sprintf("%d:0:1.1:%s", claim.Milliseconds(), deadOwner)
				if tc.listen {
					sub := b.rdb(t).Subscribe(ctx, k.channel+deadID)
					t.Cleanup(func() { _ = sub.Close() })
					_, err := sub.Receive(ctx)
					require.NoError(t, err)
				}
				require.NoError(t, rdb.RPush(ctx, k.queue, dead).Err()) // the earliest arrival
				require.NoError(t, rdb.PExpire(ctx, k.queue, time.Minute).Err())

				wc := b.client(t)
				w := goLock(t, wc.NewMutex(name))
				waitFor(t, "the waiter in the queue", func() bool {
					for _, e := range rdb.LRange(ctx, k.queue, 0, -1).Val() {
						if strings.Contains(e, wc.id) {
							return true
						}
					}
					return false
				})
				holder.Unlock()

				if tc.listen {
					// Granted to the dead entry, for its claim window only.
					assert.Equal(t, []string{deadOwner}, rdb.HKeys(ctx, k.hash).Val(), "holder in Redis after the release")
					pttl := rdb.PTTL(ctx, k.hash).Val()
					assert.True(t, pttl > 0 && pttl <= claim, "PTTL of a grant to a dead entry: got %v, want (0, %v]", pttl, claim)
					b.fastForward(claim)
				}
				require.NoError(t, await(t, w.locked, "the live waiter to get the lock"))
				fields := rdb.HKeys(ctx, k.hash).Val()
				if assert.Len(t, fields, 1) {
					assert.True(t, strings.HasPrefix(fields[0], wc.id+":"), "holder in Redis: got %s, want the waiter's client %s", fields[0], wc.id)
				}
				w.release()
				require.NoError(t, await(t, w.unlocked, "the waiter to unlock"))
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys left behind")
			})
		}
	})
}

// TestGiveUpLeavesNothing: a LockContext that ends by its context while
// queued leaves no hold, no queue entry, no renewal and (once it lingered
// out) no subscription.
func TestGiveUpLeavesNothing(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		for _, tc := range []struct {
			name    string
			timeout time.Duration // 0: cancelled once queued
			want    error
		}{{"cancelled", 0, context.Canceled}, {"deadline", 2 * time.Second, context.DeadlineExceeded}} {
			t.Run(tc.name, func(t *testing.T) {
				name := lockName(t)
				k := keysOf(name)
				ctx := context.Background()
				rdb := b.rdb(t)
				hc := b.client(t)
				holder := hc.NewMutex(name)
				holder.Lock()

				enqueued := make(chan struct{}, 1)
				wrdb := b.rdb(t)
				wrdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
					err := next(ctx, cmd)
					if queuedReply(cmd) {
						select {
						case enqueued <- struct{}{}:
						default:
						}
					}
					return err
				}})
				wc := clientOn(t, wrdb)
				wm := wc.NewMutex(name)
				wctx, cancel := context.WithCancel(ctx)
				defer cancel()
				if tc.timeout > 0 {
					wctx, cancel = context.WithTimeout(wctx, tc.timeout)
					defer cancel()
				}
				type outcome struct {
					err   error
					count int
					lost  bool
				}
				res := make(chan outcome, 1)
				go func() {
					err := wm.LockContext(wctx)
					res <- outcome{err, wm.HoldCount(), isClosed(wm.Lost())}
				}()
				await(t, enqueued, "the waiter to join the queue")
				if tc.timeout == 0 {
					cancel()
				}
				r := await(t, res, "LockContext to give up")
				assert.ErrorIs(t, r.err, tc.want)
				if r.err != nil {
					assert.Contains(t, r.err.Error(), name, "the error names the lock")
				}
				assert.Equal(t, outcome{r.err, 0, true}, r, "HoldCount and Lost after giving up")

				settled(t, wc) // the leave is sent after LockContext returns
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.queue).Val(), "queue keys after giving up")
				fields := rdb.HKeys(ctx, k.hash).Val()
				if assert.Len(t, fields, 1, "holds in Redis") {
					assert.True(t, strings.HasPrefix(fields[0], hc.id+":"), "holder in Redis: got %s, want the holder's client", fields[0])
				}
				assert.Equal(t, 0, watchdogHolds(wc), "holds renewed by the waiter's Client")
				waitFor(t, "no subscriber left on "+k.channel, func() bool { return numSub(t, rdb, k.channel) == 0 })

				// Nothing was granted to the waiter that left: the lock is free
				// once its holder unlocks.
				holder.Unlock()
				assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash).Val(), "key after the holder's Unlock")
				other := b.client(t).NewMutex(name)
				ok, err := other.TryLockContext(testCtx(t, hangGuard)) // not TryLock, whose 300ms a busy machine can outlast
				require.True(t, ok, "TryLockContext after everyone left: got (false, %v), want true", err)
				other.Unlock()
			})
		}
	})
}

// errCutOff is the error of a call a test's hook keeps from Redis.
var errCutOff = errors.New("call cut off by the test")

// TestGiveUpReleasesGrant: a queued waiter that gives up just as the queue
// grants it the lock releases that grant when it leaves, instead of
// blocking the lock for a claim window. The grant message and the waiter's
// refreshes are held back (a paused proxy, a hook) so that the waiter sees
// its context end first.
func TestGiveUpReleasesGrant(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		k := keysOf(name)
		ctx := context.Background()
		rdb := b.rdb(t)
		holder := b.client(t).NewMutex(name)
		holder.Lock()

		p := redistest.NewProxy(t, b.addr)
		var holdRefresh sync.Once
		holding := make(chan struct{})
		enqueued := make(chan struct{}, 1)
		leaving := make(chan struct{}, 1)
		wrdb := redis.NewClient(&redis.Options{Addr: p.Addr()})
		t.Cleanup(func() { _ = wrdb.Close() })
		wrdb.AddHook(hookFuncs{process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			switch s, _ := scriptCall(cmd); s {
			case "acquire":
				select {
				case <-holding:
					// A refresh that does not get through (answered at once:
					// the drainer's calls have no deadline to wait for).
					cmd.SetErr(errCutOff)
					return errCutOff
				default:
				}
				err := next(ctx, cmd)
				if queuedReply(cmd) {
					select {
					case enqueued <- struct{}{}:
					default:
					}
				}
				return err
			case "leave":
				select {
				case leaving <- struct{}{}:
				default:
				}
			}
			return next(ctx, cmd)
		}})
		wc := clientOn(t, wrdb)
		t.Cleanup(p.Resume) // before the Client closes
		wm := wc.NewMutex(name)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		res := make(chan error, 1)
		go func() { res <- wm.LockContext(wctx) }()

		await(t, enqueued, "the waiter to join the queue")
		faultSubscribed(t, rdb, k.channel) // else the release drops its entry, as a dead waiter's
		holdRefresh.Do(func() { close(holding) })
		p.Pause()
		holder.Unlock()
		fields := rdb.HKeys(ctx, k.hash).Val()
		require.Len(t, fields, 1, "holds in Redis after the release")
		require.True(t, strings.HasPrefix(fields[0], wc.id+":"), "holder in Redis: got %s, want the waiter's client", fields[0])

		cancel()
		await(t, leaving, "the waiter to leave the queue")
		p.Resume()
		// Given up by the cancel, or, should a refresh come before it, by
		// the refresh's error (a plain one: permanent): either way the
		// grant must be given back.
		if err := await(t, res, "LockContext to give up"); !errors.Is(err, context.Canceled) && !errors.Is(err, errCutOff) {
			t.Errorf("LockContext: got %v, want context.Canceled or the cut-off refresh's error", err)
		}
		settled(t, wc)
		assert.Equal(t, int64(0), rdb.Exists(ctx, k.hash, k.queue).Val(), "keys after the waiter left")
		assert.Equal(t, 0, watchdogHolds(wc), "holds renewed by the waiter's Client")
	})
}

// recordingHandler is a slog handler that keeps the messages of the records
// it gets.
type recordingHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler            { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *recordingHandler) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

// TestSubscribeDenied: a Client whose user may not SUBSCRIBE (ACL) still gets
// the lock after a release, and logs the fallback once. Only on the real
// server: miniredis does not enforce ACL command permissions.
func TestSubscribeDenied(t *testing.T) {
	srv := redistest.Shared(t)
	b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
	name := lockName(t)
	k := keysOf(name)
	ctx := context.Background()
	admin := b.rdb(t)
	user := "nosub-" + strings.ReplaceAll(name, ".", "-")
	require.NoError(t, admin.Do(ctx, append([]interface{}{"acl", "setuser", user, "on", ">pw", "~*", "&*", "+@all"}, knownRules(t, admin, "-subscribe", "-ssubscribe", "-psubscribe")...)...).Err())
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })

	rec := &recordingHandler{}
	wrdb := b.rdb(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" })
	wc := clientOn(t, wrdb, WithLogger(slog.New(rec)))
	holder := b.client(t).NewMutex(name)
	for round := 0; round < 2; round++ {
		holder.Lock()
		w := goLock(t, wc.NewMutex(name))
		waitFor(t, "the waiter in the queue", func() bool { return admin.LLen(ctx, k.queue).Val() == 1 })
		holder.Unlock()
		require.NoError(t, await(t, w.locked, "the waiter to get the lock"), "round %d", round)
		w.release()
		require.NoError(t, await(t, w.unlocked, "the waiter to unlock"), "round %d", round)
	}
	assert.Equal(t, 1, rec.count("SUBSCRIBE denied"), "log records of the fallback to polling")
}

// queuedReply reports whether cmd is an acquire call that queued its caller.
func queuedReply(cmd redis.Cmder) bool {
	if s, _ := scriptCall(cmd); s != "acquire" || cmd.Err() != nil {
		return false
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return false
	}
	r, err := parseReply(c.Val())
	return err == nil && r.Code == replyQueued
}
