package remutex

// Go's sync.Once tests (once_test.go: TestOnce, TestOncePanic), ported onto
// DistOnce where they apply, and what a once across processes adds: many
// Clients race and one runs, a failed run's waiters get its error and the
// next Do runs again, Reset, foreign data, the quorum refusal.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// onceKeysOf are the keys of the once called name under the default prefix.
type onceKeyNames struct{ hash, queue, done, err string }

func onceKeysOf(name string) onceKeyNames {
	k := onceKeys(DefaultKeyPrefix, name)
	return onceKeyNames{hash: k[0], queue: k[2], done: k[3], err: k[4]}
}

// onceWaiters waits until n callers wait in the once's queue (Redis's).
func onceWaiters(t testing.TB, rdb *redis.Client, name string, n int64) {
	t.Helper()
	q := onceKeysOf(name).queue
	waitFor(t, fmt.Sprintf("%d waiters in %s", n, q), func() bool {
		return rdb.LLen(context.Background(), q).Val() == n
	})
}

// doAsync runs o.Do(ctx, f) on a goroutine of the test, joined at cleanup;
// its result comes on the channel.
func doAsync(t testing.TB, ctx context.Context, o *DistOnce, f func(context.Context) error) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res <- o.Do(ctx, f)
	}()
	t.Cleanup(func() { <-done })
	return res
}

// TestOnce (sync's TestOnce): goroutines of several Clients call Do at
// once; f runs exactly once and every Do returns after it, nil. Then Do
// returns nil with no command, as a sync.Once's does.
func TestOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const clients, goroutines = 4, 4
		name := lockName(t)
		ctx := testCtx(t, 2*hangGuard)
		var runs, finished atomic.Int32
		f := func(context.Context) error {
			runs.Add(1)
			finished.Store(1)
			return nil
		}
		onces := make([]*DistOnce, clients)
		logs := make([]*commandLog, clients)
		for i := range onces {
			rdb := b.rdb(t)
			logs[i] = newCommandLog()
			rdb.AddHook(logs[i])
			onces[i] = clientOn(t, rdb).NewOnce(name)
		}
		errc := make(chan error, clients*goroutines)
		var wg sync.WaitGroup
		for _, o := range onces {
			for g := 0; g < goroutines; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := o.Do(ctx, f)
					if err == nil && finished.Load() == 0 {
						err = errors.New("Do returned before f finished")
					}
					errc <- err
				}()
			}
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			require.NoError(t, err)
		}
		assert.Equal(t, int32(1), runs.Load(), "runs of f")
		for i, o := range onces {
			_, before := logs[i].counts()
			require.NoError(t, o.Do(ctx, f))
			done, err := o.Done(ctx)
			require.NoError(t, err)
			assert.True(t, done, "Done")
			_, after := logs[i].counts()
			assert.Equal(t, len(before), len(after), "commands of Do and Done once known done")
		}
		// A new value finds the record: one command, and f does not run.
		rdb := b.rdb(t)
		log := newCommandLog()
		rdb.AddHook(log)
		o := clientOn(t, rdb).NewOnce(name)
		require.NoError(t, o.Do(ctx, f))
		_, cmds := log.counts()
		cmds = slices.DeleteFunc(cmds, func(c string) bool { return c == "hello" || c == "client" })
		assert.Equal(t, []string{"get", "get"}, cmds, "commands of a Do that finds the record (beside the connection's setup)")
		var gets []time.Time
		for _, c := range log.since(time.Time{}) {
			if fmt.Sprint(c.args[0]) == "get" {
				gets = append(gets, c.at)
			}
		}
		if assert.Len(t, gets, 2) {
			assert.Equal(t, gets[0], gets[1], "the GETs of a Do that finds the record: one pipeline (recorded together)")
		}
		assert.Equal(t, int32(1), runs.Load(), "runs of f")
		k := onceKeysOf(name)
		ttl := rdb.PTTL(ctx, k.done).Val()
		assert.Equal(t, int64(-1), int64(ttl), "the done record's TTL: none")
		assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue, k.err).Val(), "lock, queue or error record left")
	})
}

// TestOncePanic (sync's TestOncePanic): the panic of f goes on in the
// runner; the run is not done, so the next Do runs f (sync.Once counts a
// panicked f as done; a DistOnce does not: a run that crashed did not
// happen).
func TestOncePanic(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		o := b.client(t).NewOnce(lockName(t))
		p := faultPanic(func() {
			_ = o.Do(ctx, func(context.Context) error { panic("failed") })
		})
		assert.Equal(t, "failed", p, "the panic Do let through")
		done, err := o.Done(ctx)
		require.NoError(t, err)
		assert.False(t, done, "Done after a panicked run")
		ran := false
		require.NoError(t, o.Do(ctx, func(context.Context) error { ran = true; return nil }))
		assert.True(t, ran, "f run again after a panicked run")
	})
}

// TestOnceRecursiveDo: Do from f on the same value returns ErrRecursiveDo
// (sync.Once deadlocks), and the outer run goes on.
func TestOnceRecursiveDo(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		o := b.client(t).NewOnce(lockName(t))
		var inner error
		require.NoError(t, o.Do(ctx, func(ctx context.Context) error {
			inner = o.Do(ctx, func(context.Context) error { return nil })
			return nil
		}))
		assert.ErrorIs(t, inner, ErrRecursiveDo, "the inner Do")
		done, err := o.Done(ctx)
		require.NoError(t, err)
		assert.True(t, done, "Done after the outer run")
	})
}

// TestOnceFailedRun: a run that fails while callers of other Clients wait
// for it gives each of them its error, an *OnceError that names its host,
// process and message; it records nothing, and the next Do runs f again.
func TestOnceFailedRun(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		const waiters = 3
		name := lockName(t)
		ctx := testCtx(t, 2*hangGuard)
		rdb := b.rdb(t)
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error {
			close(started)
			<-release
			return errors.New("migration v42: column exists")
		})
		<-started
		var ran atomic.Int32
		res := make([]<-chan error, waiters)
		for i := range res {
			res[i] = doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error { ran.Add(1); return nil })
		}
		onceWaiters(t, rdb, name, waiters)
		close(release)
		assert.EqualError(t, await(t, runner, "the runner's Do"), "migration v42: column exists", "the runner's Do")
		host, _ := os.Hostname()
		for i, r := range res {
			err := await(t, r, "a waiter's Do")
			var oe *OnceError
			require.ErrorAs(t, err, &oe, "waiter %d: got %v, want an *OnceError", i, err)
			assert.Equal(t, "migration v42: column exists", oe.Message)
			assert.Equal(t, os.Getpid(), oe.PID, "the runner's pid")
			assert.Equal(t, host, oe.Host, "the runner's host")
			assert.Contains(t, err.Error(), "column exists")
		}
		assert.Zero(t, ran.Load(), "runs of f by the failed run's waiters")
		k := onceKeysOf(name)
		assert.Zero(t, rdb.Exists(ctx, k.done).Val(), "done record after a failed run")
		// The next Do runs f again.
		o := b.client(t).NewOnce(name)
		require.NoError(t, o.Do(ctx, func(context.Context) error { ran.Add(1); return nil }))
		assert.Equal(t, int32(1), ran.Load(), "runs of f after the failed run")
		assert.Zero(t, rdb.Exists(ctx, k.err).Val(), "error record after a successful run")
	})
}

// TestOnceReset: Reset makes the once not done (f runs again for a value
// that had not seen the record); Reset while callers wait for a run leaves
// that run be: it records its outcome and the waiters return with it.
func TestOnceReset(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := testCtx(t, 2*hangGuard)
		rdb := b.rdb(t)
		var runs atomic.Int32
		f := func(context.Context) error { runs.Add(1); return nil }
		o := b.client(t).NewOnce(name)
		require.NoError(t, o.Do(ctx, f))
		require.NoError(t, o.Reset(ctx))
		done, err := o.Done(ctx)
		require.NoError(t, err)
		assert.False(t, done, "Done after Reset")
		require.NoError(t, b.client(t).NewOnce(name).Do(ctx, f))
		assert.Equal(t, int32(2), runs.Load(), "runs after Reset")

		require.NoError(t, o.Reset(ctx))
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, o, func(context.Context) error {
			close(started)
			<-release
			return f(ctx)
		})
		<-started
		w1 := doAsync(t, ctx, b.client(t).NewOnce(name), f)
		w2 := doAsync(t, ctx, b.client(t).NewOnce(name), f)
		onceWaiters(t, rdb, name, 2)
		require.NoError(t, b.client(t).NewOnce(name).Reset(ctx))
		close(release)
		require.NoError(t, await(t, runner, "the runner"))
		require.NoError(t, await(t, w1, "waiter 1"))
		require.NoError(t, await(t, w2, "waiter 2"))
		assert.Equal(t, int32(3), runs.Load(), "runs: the waiters ran nothing")
		done, err = b.client(t).NewOnce(name).Done(ctx)
		require.NoError(t, err)
		assert.True(t, done, "Done after the run that outlived Reset")
	})
}

// TestOnceForeignData: a record key that holds what remutex did not write
// is a *WrongTypeError naming it; f does not run and the data stays.
func TestOnceForeignData(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		for _, tc := range []struct {
			name, typ string
			write     func(key string) error
		}{
			{"string", foreignRecord, func(key string) error { return rdb.Set(ctx, key, "v42", 0).Err() }},
			{"json", foreignRecord, func(key string) error { return rdb.Set(ctx, key, `{"v":2}`, 0).Err() }},
			{"hash", "hash", func(key string) error { return rdb.HSet(ctx, key, "a", "b").Err() }},
		} {
			for _, which := range []string{"done", "err"} {
				t.Run(tc.name+"/"+which, func(t *testing.T) {
					name := lockName(t)
					k := onceKeysOf(name)
					key := map[string]string{"done": k.done, "err": k.err}[which]
					require.NoError(t, tc.write(key))
					o := b.client(t).NewOnce(name)
					ran := false
					err := o.Do(ctx, func(context.Context) error { ran = true; return nil })
					var wt *WrongTypeError
					require.ErrorAs(t, err, &wt, "Do: got %v", err)
					assert.Equal(t, key, wt.Key)
					assert.Equal(t, tc.typ, wt.Type)
					assert.False(t, ran, "f ran")
					_, err = o.Done(ctx)
					assert.ErrorAs(t, err, &wt, "Done")
					assert.Equal(t, tc.name == "hash", rdb.Type(ctx, key).Val() == "hash", "the data left as it was")
					assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue).Val(), "lock or queue left")
				})
			}
		}
	})
}

// TestOnceOwnKeys: a DistMutex of the same name and a DistOnce never meet:
// the mutex held does not stop the once's run.
func TestOnceOwnKeys(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		ctx := testCtx(t, hangGuard)
		name := lockName(t)
		c := b.client(t)
		m := c.NewMutex(name)
		require.NoError(t, m.LockContext(ctx))
		defer m.Unlock()
		ran := false
		require.NoError(t, c.NewOnce(name).Do(ctx, func(context.Context) error { ran = true; return nil }))
		assert.True(t, ran, "f ran while the mutex of its name was held")
	})
}

// TestOnceInspect: Inspect shows who runs and who waits, then who ran it.
func TestOnceInspect(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := testCtx(t, 2*hangGuard)
		rdb := b.rdb(t)
		o := b.client(t).NewOnce(name)
		info, err := o.Inspect(ctx)
		require.NoError(t, err)
		assert.False(t, info.Done)
		assert.Empty(t, info.Lock.Holders)
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, o, func(context.Context) error { close(started); <-release; return nil })
		<-started
		w := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error { return nil })
		onceWaiters(t, rdb, name, 1)
		info, err = o.Inspect(ctx)
		require.NoError(t, err)
		assert.Equal(t, "once", info.Lock.Kind)
		require.Len(t, info.Lock.Holders, 1, "the runner")
		assert.Equal(t, os.Getpid(), info.Lock.Holders[0].PID)
		assert.Len(t, info.Lock.Waiters, 1, "the waiter")
		close(release)
		require.NoError(t, await(t, runner, "the runner"))
		require.NoError(t, await(t, w, "the waiter"))
		info, err = o.Inspect(ctx)
		require.NoError(t, err)
		assert.True(t, info.Done)
		require.NotNil(t, info.Run)
		assert.Equal(t, os.Getpid(), info.Run.PID)
		assert.Empty(t, info.Lock.Holders)
	})
}

// TestOnceHoldLost: f's context ends when the run's hold is lost (the key
// deleted), and the run is not recorded.
func TestOnceHoldLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := testCtx(t, hangGuard)
		rdb := b.rdb(t)
		o := b.client(t).NewOnce(name, WithLease(MinLease*4))
		err := o.Do(ctx, func(ctx context.Context) error {
			require.NoError(t, rdb.Del(ctx, onceKeysOf(name).hash).Err())
			<-ctx.Done()
			return context.Cause(ctx)
		})
		assert.ErrorIs(t, err, ErrLockLost)
		done, derr := o.Done(context.Background())
		require.NoError(t, derr)
		assert.False(t, done, "Done after a run whose hold was lost")
	})
}

// TestOnceQuorumRefused: a quorum Client cannot keep "done" exact, so
// NewOnce panics on one, saying why, before any command.
func TestOnceQuorumRefused(t *testing.T) {
	log := newCommandLog()
	var rdbs []redis.UniversalClient
	for i := 0; i < 3; i++ {
		rdb := rdbAt(t, miniredis.RunT(t).Addr())
		rdb.AddHook(log)
		rdbs = append(rdbs, rdb)
	}
	q := NewQuorumClient(rdbs)
	t.Cleanup(func() { _ = q.Close() })
	msg := panicOf(t, "NewOnce on a quorum Client", func() { q.NewOnce(lockName(t)) })
	for _, want := range []string{"remutex: ", "quorum", "done", "majority"} {
		assert.Contains(t, msg, want, "the panic")
	}
	_, cmds := log.counts()
	assert.Empty(t, cmds, "commands sent")
}

// TestOnceBadInput: NewOnce panics on what NewMutex panics on, and on
// WithMinHold, before any command.
func TestOnceBadInput(t *testing.T) {
	c := NewClient(rdbAt(t, miniredis.RunT(t).Addr()))
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		what string
		f    func()
	}{
		{"empty name", func() { c.NewOnce("") }},
		{"long name", func() { c.NewOnce(strings.Repeat("x", MaxNameLen+1)) }},
		{"short lease", func() { c.NewOnce("x", WithLease(MinLease/2)) }},
		{"min hold", func() { c.NewOnce("x", WithMinHold(MinLease)) }},
		{"nil client", func() { (*Client)(nil).NewOnce("x") }},
	} {
		assert.True(t, strings.HasPrefix(panicOf(t, tc.what, tc.f), "remutex: "), tc.what)
	}
	assert.Panics(t, func() { _ = (&DistOnce{}).Do(context.Background(), nil) }, "a zero DistOnce")
}

// TestLeastPrivilegeACLOnce runs a DistOnce as a user with the documented
// ACL: a run with a waiter woken by its end, a failed run's error for its
// waiter, Done, Inspect and Reset.
func TestLeastPrivilegeACLOnce(t *testing.T) {
	srv, rdb := aclServer(t, lockUserACL...)
	ctx := testCtx(t, 2*hangGuard)
	a, errs := clientWithErrors(t, rdb)
	b, berrs := clientWithErrors(t, newRDB(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"}))
	admin := rdbAt(t, srv.Addr())
	for _, fail := range []bool{true, false} {
		name := lockName(t)
		oa, ob := a.NewOnce(name, WithFencing()), b.NewOnce(name, WithFencing())
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, oa, func(context.Context) error {
			close(started)
			<-release
			if fail {
				return errors.New("failed")
			}
			return nil
		})
		<-started
		ran := false
		waiter := doAsync(t, ctx, ob, func(context.Context) error { ran = true; return nil })
		onceWaiters(t, admin, name, 1)
		info, err := ob.Inspect(ctx)
		require.NoError(t, err, "Inspect as the lock user")
		assert.Len(t, info.Lock.Waiters, 1, "waiters Inspect shows")
		close(release)
		rerr, werr := await(t, runner, "the runner"), await(t, waiter, "the waiter")
		var oe *OnceError
		if fail {
			assert.EqualError(t, rerr, "failed")
			assert.ErrorAs(t, werr, &oe, "the waiter of a failed run")
		} else {
			assert.NoError(t, rerr)
			assert.NoError(t, werr)
		}
		assert.False(t, ran, "the waiter ran f")
		done, err := ob.Done(ctx)
		require.NoError(t, err)
		assert.Equal(t, !fail, done, "Done")
		require.NoError(t, ob.Reset(ctx), "Reset as the lock user")
	}
	if all := append(errs.all(), berrs.all()...); len(all) > 0 {
		t.Errorf("the lock user's Clients reported %v", all)
	}
}

// TestOnceSameValue: goroutines of one value wait for its Do under way
// without a queue entry of their own in Redis, and return with its run: the
// run's error as an *OnceError when it failed; a waiter whose context ends
// returns its error; after the failure the next Do runs f again.
func TestOnceSameValue(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		name := lockName(t)
		ctx := testCtx(t, 2*hangGuard)
		rdb := b.rdb(t)
		o := b.client(t).NewOnce(name)
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, o, func(context.Context) error { close(started); <-release; return errors.New("boom") })
		<-started
		var ran atomic.Int32
		f := func(context.Context) error { ran.Add(1); return nil }
		w1, w2 := doAsync(t, ctx, o, f), doAsync(t, ctx, o, f)
		cctx, cancel := context.WithCancel(ctx)
		w3 := doAsync(t, cctx, o, f)
		waitFor(t, "3 calls waiting for the value's run", func() bool {
			o.mu.Lock()
			defer o.mu.Unlock()
			return o.joined == 3
		})
		cancel()
		assert.ErrorIs(t, await(t, w3, "the cancelled waiter"), context.Canceled)
		assert.Zero(t, rdb.LLen(ctx, onceKeysOf(name).queue).Val(), "queue entries of the value's waiters")
		close(release)
		assert.EqualError(t, await(t, runner, "the runner"), "boom")
		for _, w := range []<-chan error{w1, w2} {
			var oe *OnceError
			err := await(t, w, "a waiter")
			require.ErrorAs(t, err, &oe, "a waiter of the value: got %v", err)
			assert.Equal(t, "boom", oe.Message)
		}
		assert.Zero(t, ran.Load(), "runs by the waiters")
		require.NoError(t, o.Do(ctx, f))
		assert.Equal(t, int32(1), ran.Load(), "runs after the failure")
	})
}

// acquireSends records when a redis client sent its acquire calls.
type acquireSends struct {
	mu sync.Mutex
	at []time.Time // of those answered
}

func (s *acquireSends) hook() hookFuncs {
	record := func(sent time.Time, cmds ...redis.Cmder) {
		for _, cmd := range cmds {
			if name, _ := scriptCall(cmd); name == "acquire" {
				s.mu.Lock()
				s.at = append(s.at, sent)
				s.mu.Unlock()
			}
		}
	}
	return hookFuncs{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			sent := time.Now()
			err := next(ctx, cmd)
			record(sent, cmd)
			return err
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			sent := time.Now()
			err := next(ctx, cmds)
			record(sent, cmds...)
			return err
		},
	}
}

// sentAfter reports whether an acquire call sent after t was answered.
func (s *acquireSends) sentAfter(t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at) > 0 && s.at[len(s.at)-1].After(t)
}

// awaitHeard waits until the waiters of onces, whose redis clients' acquire
// calls sends record, hear their lock's messages: each one's Client
// confirmed the subscription, and then a call of the waiter was answered
// (it then sleeps until a message, or its entry's next refresh).
func awaitHeard(t testing.TB, onces []*DistOnce, sends []*acquireSends) {
	t.Helper()
	confirmed := make([]time.Time, len(onces))
	waitFor(t, "the waiters to hear their lock's messages", func() bool {
		all := true
		for i, o := range onces {
			if confirmed[i].IsZero() {
				if transport.Confirmed(o.m.c.be, o.m.spec.channel) {
					confirmed[i] = time.Now()
				}
			}
			all = all && !confirmed[i].IsZero() && sends[i].sentAfter(confirmed[i])
		}
		return all
	})
}

// TestOnceWaitersTold: when a run ends, its waiters on other Clients
// return with its outcome (nil, or its *OnceError) from the message of the
// run's final release, and leave no queue entry: none is handed the lock
// to read the outcome and pass it on to the next, one after the other (a
// chain of two round trips per waiter). After a failed run the next Do of
// all its waiters at once runs f exactly once.
func TestOnceWaitersTold(t *testing.T) {
	eachBackendParallel(t, func(t *testing.T, b *testBackend) {
		for _, fail := range []bool{false, true} {
			t.Run(map[bool]string{false: "done", true: "failed"}[fail], func(t *testing.T) {
				const waiters = 4
				name := lockName(t)
				ctx := testCtx(t, 2*hangGuard)
				rdb := b.rdb(t)
				started, release := make(chan struct{}), make(chan struct{})
				runner := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error {
					close(started)
					<-release
					if fail {
						return errors.New("boom")
					}
					return nil
				})
				<-started
				var ran atomic.Int32
				f := func(context.Context) error { ran.Add(1); return nil }
				onces := make([]*DistOnce, waiters)
				sends := make([]*acquireSends, waiters)
				res := make([]<-chan error, waiters)
				var handed, waited, failedWaits atomic.Int32
				count := WithHook(func(ev Event) {
					switch {
					case ev.Kind == EventAcquired && ev.Granted:
						handed.Add(1) // a waiter the queue handed the lock
					case ev.Kind == EventWaited && ev.Err != nil:
						failedWaits.Add(1)
						fallthrough
					case ev.Kind == EventWaited:
						waited.Add(1)
					}
				})
				for i := range onces {
					wrdb := b.rdb(t)
					sends[i] = &acquireSends{}
					wrdb.AddHook(sends[i].hook())
					onces[i] = clientOn(t, wrdb, count).NewOnce(name)
					res[i] = doAsync(t, ctx, onces[i], f)
				}
				onceWaiters(t, rdb, name, waiters)
				awaitHeard(t, onces, sends)
				close(release)
				rerr := await(t, runner, "the runner's Do")
				for i, r := range res {
					err := await(t, r, "a waiter's Do")
					if fail {
						var oe *OnceError
						require.ErrorAs(t, err, &oe, "waiter %d: got %v, want an *OnceError", i, err)
						assert.Equal(t, "boom", oe.Message, "waiter %d", i)
					} else {
						require.NoError(t, err, "waiter %d", i)
					}
				}
				if fail {
					assert.EqualError(t, rerr, "boom", "the runner's Do")
				} else {
					require.NoError(t, rerr, "the runner's Do")
				}
				// (A waiter whose refresh crossed the release finds its entry
				// gone and takes the free lock, not handed over; should two,
				// the second may be handed it by the first.)
				assert.LessOrEqual(t, handed.Load(), int32(1), "waiters handed the lock after the run, of %d", waiters)
				assert.Zero(t, ran.Load(), "runs of f by the run's waiters")
				assert.Equal(t, int32(waiters), waited.Load(), "EventWaited of the waiters")
				assert.Zero(t, failedWaits.Load(), "EventWaited with an error: the waiters' Do had its outcome")
				k := onceKeysOf(name)
				assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue).Val(), "lock or queue left")
				if !fail {
					for i, o := range onces {
						assert.True(t, o.done.Load(), "waiter %d's value knows the once is done", i)
					}
					return
				}
				// The failed run's waiters try again, all at once: one runs f.
				again := make([]<-chan error, waiters)
				for i, o := range onces {
					again[i] = doAsync(t, ctx, o, f)
				}
				for _, r := range again {
					require.NoError(t, await(t, r, "a Do after the failed run"))
				}
				assert.Equal(t, int32(1), ran.Load(), "runs of f after the failed run")
				assert.Zero(t, rdb.Exists(ctx, k.hash, k.queue, k.err).Val(), "lock, queue or error record left")
			})
		}
	})
}

// TestOnceWaiterUntold: a waiter whose Client does not hear the run's
// release (its user may not SUBSCRIBE: it polls) finds its entry gone at
// its next call and returns with the outcome in Redis: nil for a done
// run, the *OnceError of a failed one, without running f; nothing is left
// in the queue. Only on the real server: miniredis does not enforce ACL
// command permissions.
func TestOnceWaiterUntold(t *testing.T) {
	srv := redistest.Shared(t)
	b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
	ctx := testCtx(t, 2*hangGuard)
	admin := b.rdb(t)
	user := noSubscribeUser(t, admin)
	deaf := clientOn(t, b.rdb(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" }))
	for _, fail := range []bool{true, false} {
		name := lockName(t)
		started, release := make(chan struct{}), make(chan struct{})
		runner := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error {
			close(started)
			<-release
			if fail {
				return errors.New("boom")
			}
			return nil
		})
		<-started
		ran := false
		w := doAsync(t, ctx, deaf.NewOnce(name), func(context.Context) error { ran = true; return nil })
		heard := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error { ran = true; return nil })
		onceWaiters(t, admin, name, 2)
		close(release)
		rerr := await(t, runner, "the runner")
		for _, r := range []<-chan error{w, heard} {
			err := await(t, r, "a waiter")
			if fail {
				var oe *OnceError
				assert.ErrorAs(t, err, &oe, "a waiter of a failed run: got %v", err)
			} else {
				assert.NoError(t, err, "a waiter of a done run")
			}
		}
		assert.Equal(t, fail, rerr != nil, "the runner's error: %v", rerr)
		assert.False(t, ran, "a waiter ran f")
		k := onceKeysOf(name)
		assert.Zero(t, admin.Exists(ctx, k.hash, k.queue).Val(), "lock or queue left (fail %v)", fail)
	}
}

// noSubscribeUser creates an ACL user who may not SUBSCRIBE (its Clients
// poll), removed at cleanup, and returns its name.
func noSubscribeUser(t *testing.T, admin *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	user := "nosub-" + strings.ReplaceAll(lockName(t), ".", "-")
	require.NoError(t, admin.Do(ctx, append([]interface{}{"acl", "setuser", user, "on", ">pw", "~*", "&*", "+@all"}, knownRules(t, admin, "-subscribe", "-ssubscribe", "-psubscribe")...)...).Err())
	t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
	return user
}

// TestOnceWaiterUntoldNextRun: a waiter that did not hear its run's end
// (it polls) and finds its entry gone while the next run holds the lock
// returns its own run's error from Redis at once: it does not queue again
// and wait for the next run. Only on the real server (ACL).
func TestOnceWaiterUntoldNextRun(t *testing.T) {
	srv := redistest.Shared(t)
	b := &testBackend{name: "redis-server", addr: srv.Addr(), srv: srv}
	ctx := testCtx(t, 2*hangGuard)
	admin := b.rdb(t)
	user := noSubscribeUser(t, admin)
	var (
		mu   sync.Mutex
		shut chan struct{} // while not nil, the deaf Client's acquire calls wait for it to close
	)
	gate := func(cmds ...redis.Cmder) {
		for _, cmd := range cmds {
			if name, _ := scriptCall(cmd); name == "acquire" {
				mu.Lock()
				ch := shut
				mu.Unlock()
				if ch != nil {
					<-ch
				}
				return
			}
		}
	}
	drdb := b.rdb(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" })
	drdb.AddHook(hookFuncs{
		process: func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
			gate(cmd)
			return next(ctx, cmd)
		},
		pipeline: func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
			gate(cmds...)
			return next(ctx, cmds)
		},
	})
	name := lockName(t)
	started1, release1 := make(chan struct{}), make(chan struct{})
	runner1 := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error {
		close(started1)
		<-release1
		return errors.New("first")
	})
	<-started1
	ran := false
	w := doAsync(t, ctx, clientOn(t, drdb).NewOnce(name), func(context.Context) error { ran = true; return nil })
	onceWaiters(t, admin, name, 1)
	open := make(chan struct{})
	mu.Lock()
	shut = open
	mu.Unlock()
	close(release1)
	assert.EqualError(t, await(t, runner1, "the first runner"), "first")
	started2, release2 := make(chan struct{}), make(chan struct{})
	end2 := sync.OnceFunc(func() { close(release2) })
	defer end2() // (before the cleanup that joins runner2, should the test fail)
	runner2 := doAsync(t, ctx, b.client(t).NewOnce(name), func(context.Context) error {
		close(started2)
		<-release2
		return nil
	})
	<-started2
	mu.Lock()
	shut = nil
	mu.Unlock()
	close(open)
	err := await(t, w, "the deaf waiter, while the next run goes on")
	var oe *OnceError
	if assert.ErrorAs(t, err, &oe, "the deaf waiter: got %v", err) {
		assert.Equal(t, "first", oe.Message, "the deaf waiter's error: its own run's")
	}
	assert.False(t, ran, "the deaf waiter ran f")
	end2()
	require.NoError(t, await(t, runner2, "the second runner"))
	k := onceKeysOf(name)
	assert.Zero(t, admin.Exists(ctx, k.hash, k.queue).Val(), "lock or queue left")
}
