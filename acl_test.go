package remutex

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// Tests under a least-privilege ACL user, as managed Redis services give
// applications: every primitive works with the ACL docs/deployments.md
// names, and Client.Check names what a narrower one lacks.

// lockUserACL is the ACL of docs/deployments.md for the default prefix.
var lockUserACL = []string{"on", ">pw", "resetkeys", "~remutex:*", "resetchannels", "&remutex:*",
	"-@all", "+@read", "+@write", "+@scripting", "+@pubsub", "+@connection", "-@dangerous", "+time"}

// aclServer starts a redis-server with an ACL user "locker" set up with
// rules, and returns a go-redis client logged in as that user.
func aclServer(t *testing.T, rules ...string) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	admin := rdbAt(t, srv.Addr())
	args := append([]interface{}{"acl", "setuser", "locker"}, knownRules(t, admin, toArgs(rules)...)...)
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	return srv, newRDB(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"})
}

// knownRules returns the ACL rules without those that allow or deny a
// command the server of rdb does not know (COMMAND INFO answers nil for
// it), which ACL SETUSER would refuse: eval_ro and ssubscribe are Redis 7
// commands, unknown to 6.2, which cannot run them anyway.
func knownRules(t testing.TB, rdb *redis.Client, rules ...interface{}) []interface{} {
	t.Helper()
	var cmds []interface{}
	for _, r := range rules {
		if s, ok := r.(string); ok && isCommandRule(s) {
			cmds = append(cmds, s[1:])
		}
	}
	if len(cmds) == 0 {
		return rules
	}
	info, err := rdb.Do(context.Background(), append([]interface{}{"command", "info"}, cmds...)...).Slice()
	if err != nil || len(info) != len(cmds) {
		t.Fatalf("COMMAND INFO %v: got %d entries, %v", cmds, len(info), err)
	}
	known := make(map[string]bool)
	for i, c := range cmds {
		known[c.(string)] = info[i] != nil
	}
	var out []interface{}
	for _, r := range rules {
		if s, ok := r.(string); ok && isCommandRule(s) && !known[s[1:]] {
			continue
		}
		out = append(out, r)
	}
	return out
}

// isCommandRule reports whether rule allows or denies one command (+get,
// -eval_ro), not a category (+@read) or a subcommand (+config|get).
func isCommandRule(rule string) bool {
	return len(rule) > 1 && (rule[0] == '+' || rule[0] == '-') && !strings.ContainsAny(rule, "@|")
}

func toArgs(ss []string) []interface{} {
	out := make([]interface{}, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestLeastPrivilegeACL runs every primitive as a user with the documented
// ACL: uncontended and contended locks (the queue, the hand-off and its
// message), fencing (the counter's seed reads the server clock), nested
// locks, TryLock, the read/write lock on both sides, Inspect, ForceUnlock
// and Check.
func TestLeastPrivilegeACL(t *testing.T) {
	srv, rdb := aclServer(t, lockUserACL...)
	ctx := testCtx(t, hangGuard)
	a, errs := clientWithErrors(t, rdb)
	b := clientOn(t, newRDB(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"}))
	if err := a.Check(ctx); err != nil {
		t.Fatalf("Check as the documented lock user: %v", err)
	}
	name := lockName(t)
	ma, mb := a.NewMutex(name, WithFencing()), b.NewMutex(name, WithFencing())
	if err := ma.LockContext(ctx); err != nil {
		t.Fatalf("LockContext: %v", err)
	}
	if err := ma.LockContext(ctx); err != nil { // nested
		t.Fatalf("nested LockContext: %v", err)
	}
	if mb.TryLock() {
		t.Errorf("TryLock of a held lock: got true")
	}
	waited := make(chan error, 1)
	go func() {
		err := mb.LockContext(ctx)
		if err == nil {
			err = mb.UnlockContext(ctx)
		}
		waited <- err
	}()
	waitFor(t, "b to queue", func() bool {
		info, err := a.Inspect(ctx, name)
		return err == nil && len(info.Waiters) == 1
	})
	for range 2 {
		if err := ma.UnlockContext(ctx); err != nil {
			t.Fatalf("UnlockContext: %v", err)
		}
	}
	if err := await(t, waited, "the waiter"); err != nil {
		t.Errorf("contended LockContext and UnlockContext as the lock user: %v", err)
	}

	rwa, rwb := a.NewRWMutex(name, WithFencing()), b.NewRWMutex(name, WithFencing())
	if err := rwa.RLockContext(ctx); err != nil {
		t.Fatalf("RLockContext: %v", err)
	}
	wrote := make(chan error, 1)
	go func() {
		err := rwb.LockContext(ctx)
		if err == nil {
			err = rwb.UnlockContext(ctx)
		}
		wrote <- err
	}()
	waitFor(t, "the writer to queue", func() bool { return waitersOf(b, &rwb.w) == 1 })
	if err := rwa.RUnlockContext(ctx); err != nil {
		t.Fatalf("RUnlockContext: %v", err)
	}
	if err := await(t, wrote, "the writer"); err != nil {
		t.Errorf("the read/write lock's writer as the lock user: %v", err)
	}

	if err := ma.LockContext(ctx); err != nil {
		t.Fatal(err)
	}
	if released, err := b.ForceUnlock(ctx, name); !released || err != nil {
		t.Errorf("ForceUnlock as the lock user: got (%v, %v), want (true, nil)", released, err)
	}
	_ = ma.UnlockContext(ctx)
	for _, err := range errs.all() {
		if !errors.Is(err, ErrLockLost) { // the forced release, found by the watchdog or Unlock
			t.Errorf("the lock user's Client reported %v", err)
		}
	}
}

// TestLeastPrivilegeACLSemaphore runs a DistSemaphore as a user with the
// documented ACL: uncontended acquisitions (the size key is written),
// fencing, TryAcquire, a contended wait with its queue entry and the
// hand-off message, releases, and Do.
func TestLeastPrivilegeACLSemaphore(t *testing.T) {
	t.Parallel()
	srv, rdb := aclServer(t, lockUserACL...)
	ctx := testCtx(t, hangGuard)
	a, errs := clientWithErrors(t, rdb)
	b, berrs := clientWithErrors(t, newRDB(t, &redis.Options{Addr: srv.Addr(), Username: "locker", Password: "pw"}))
	name := lockName(t)
	sa, sb := a.NewSemaphore(name, 2, WithFencing()), b.NewSemaphore(name, 2, WithFencing())
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatalf("Acquire(1): %v", err)
	}
	if err := sa.Acquire(ctx, 1); err != nil {
		t.Fatalf("Acquire(1) beside a holder: %v", err)
	}
	fa := sa.Fence()
	if sb.TryAcquire(1) {
		t.Errorf("TryAcquire(1) with both permits held: got true")
	}
	w := acquireAsync(t, ctx, sb, 2)
	semQueued(t, rdbAt(t, srv.Addr()), name, 1)
	sa.Release(2)
	w.acquired(t, "the waiter as the lock user")
	if fb := sb.Fence(); fb <= fa {
		t.Errorf("the waiter's fence: got %d, want above %d", fb, fa)
	}
	if err := sb.ReleaseContext(ctx, 2); err != nil {
		t.Errorf("ReleaseContext(2): %v", err)
	}
	err := sa.Do(ctx, 2, func(ctx context.Context, fence int64) error {
		if fence <= fa {
			t.Errorf("Do's fence: got %d, want above %d", fence, fa)
		}
		return nil
	})
	if err != nil {
		t.Errorf("Do(2): %v", err)
	}
	if all := append(errs.all(), berrs.all()...); len(all) > 0 {
		t.Errorf("the lock user's Clients reported %v", all)
	}
}

// TestCheckNamesWhatIsMissing: Check, run as users that lack one thing of
// the documented ACL, names the command, key or channel they may not use.
func TestCheckNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, without, replace, want string
	}{
		{"no TIME", "+time", "", "may not run time"},
		{"other keys", "~remutex:*", "~other:*", "may not use keys under the key prefix"},
		{"no PUBLISH channel", "&remutex:*", "&other:*", "SUBSCRIBE"},
		{"no scripting", "+@scripting", "", "evalsha"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rules []string
			for _, r := range lockUserACL {
				switch {
				case r != tc.without:
					rules = append(rules, r)
				case tc.replace != "":
					rules = append(rules, tc.replace)
				}
			}
			_, rdb := aclServer(t, rules...)
			err := clientOn(t, rdb).Check(testCtx(t, hangGuard))
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
				t.Errorf("Check without %s: got %v, want an error naming %q", tc.without, err, tc.want)
			}
		})
	}
}

// TestCheck: Check passes on a plain server, reports an address where
// nothing listens, and a maxmemory-policy that may evict lock keys.
func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, hangGuard)
	srv := redistest.Start(t)
	if err := clientOn(t, rdbAt(t, srv.Addr())).Check(ctx); err != nil {
		t.Errorf("Check of a plain server: %v", err)
	}
	if err := rdbAt(t, srv.Addr()).ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if err := clientOn(t, rdbAt(t, srv.Addr())).Check(ctx); !errors.Is(err, ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Errorf("Check with maxmemory-policy allkeys-lru: got %v, want ErrEvictionPolicy naming it", err)
	}
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	down := clientOn(t, newRDB(t, &redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1, DialTimeout: time.Second}))
	if err := down.Check(ctx); err == nil || !transient(errors.Unwrap(err)) && !strings.Contains(err.Error(), "refused") {
		t.Errorf("Check of an address where nothing listens: got %v, want the connection error", err)
	}
}
