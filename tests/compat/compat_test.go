package compat

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// oldCommit is the commit whose remutex command plays the old half of the
// fleet: the last commit before the engine's restructure (issue #35) began,
// so that everything after it must still speak its key, queue-entry and
// message formats. Pin a later commit when a format changes on purpose.
const oldCommit = "9e355325af454bb40e446d6b9bcd4a12188aafd3"

// childEnv names the role of the test binary when the old or the new
// remutex command runs it as the command it guards: it writes once to the
// register named by registerEnv with the fence remutex gives it.
const (
	childEnv    = "REMUTEX_COMPAT_CHILD"
	registerEnv = "REMUTEX_COMPAT_REGISTER" // addr key
	fenceEnv    = "REMUTEX_FENCE"
)

func TestMain(m *testing.M) {
	if who := os.Getenv(childEnv); who != "" {
		os.Exit(child(who))
	}
	code := m.Run()
	redistest.StopShared()
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	os.Exit(code)
}

// child is one hold of a remutex run: one section in the register.
func child(who string) int {
	addr, key, _ := strings.Cut(os.Getenv(registerEnv), " ")
	fence, err := strconv.ParseInt(os.Getenv(fenceEnv), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "compat child:", fenceEnv, err)
		return 2
	}
	r := redistest.OpenRegister(addr, key)
	defer r.Close()
	r.Enter(who, fence)()
	if errs := r.EnterErrors(); len(errs) > 0 {
		fmt.Fprintln(os.Stderr, "compat child:", errs)
		return 1
	}
	return 0
}

var builds struct {
	once     sync.Once
	dir      string
	old, new string
	err      error
}

// commands returns the remutex commands of oldCommit and of this tree,
// built once per test binary. A missing commit or a failed build skips the
// test, or fails it under REMUTEX_REQUIRE_REDIS=1 (CI).
func commands(t *testing.T) (oldBin, newBin string) {
	t.Helper()
	builds.once.Do(func() {
		builds.err = build()
	})
	if builds.err != nil {
		if os.Getenv(redistest.RequireEnv) == "1" {
			t.Fatal(builds.err)
		}
		t.Skip(builds.err)
	}
	return builds.old, builds.new
}

func build() error {
	root, err := gitOut("", "rev-parse", "--show-toplevel")
	if err != nil {
		return fmt.Errorf("find the repository root: %v", err)
	}
	if _, err := gitOut(root, "cat-file", "-e", oldCommit+"^{commit}"); err != nil {
		return fmt.Errorf("commit %s is not in this clone (a shallow clone?): fetch the history, e.g. `git fetch --unshallow`, or pin a commit it has in tests/compat", oldCommit)
	}
	dir, err := os.MkdirTemp("", "remutex-compat")
	if err != nil {
		return err
	}
	builds.dir = dir
	src := filepath.Join(dir, "old")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	archive := exec.Command("git", "archive", oldCommit)
	archive.Dir = root
	tar := exec.Command("tar", "-x", "-C", src)
	var errb, tarErr bytes.Buffer
	archive.Stderr, tar.Stderr = &errb, &tarErr
	if tar.Stdin, err = archive.StdoutPipe(); err != nil {
		return err
	}
	if err := tar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		_ = tar.Wait()
		return fmt.Errorf("git archive %s: %v: %s", oldCommit, err, errb.String())
	}
	if err := tar.Wait(); err != nil {
		return fmt.Errorf("extract %s: %v: %s", oldCommit, err, tarErr.String())
	}
	builds.old = filepath.Join(dir, "remutex-old")
	builds.new = filepath.Join(dir, "remutex-new")
	var g group
	g.Go(func() error { return goBuild(src, builds.old) })
	g.Go(func() error { return goBuild(root, builds.new) })
	return g.Wait()
}

func goBuild(dir, out string) error {
	cmd := exec.Command("go", "build", "-o", out, "./cmd/remutex")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build remutex in %s: %v\n%s", dir, err, b)
	}
	return nil
}

func gitOut(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	b, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(b)), err
}

// kind is one lock kind as the command's flags and the library's holders
// take it.
type kind struct {
	name  string
	flags []string
	// hold takes the lock on the new Client and returns its fence and the
	// release.
	hold func(ctx context.Context, c *remutex.Client, name string) (int64, func(), error)
}

var kinds = []kind{
	{name: "mutex", hold: func(ctx context.Context, c *remutex.Client, name string) (int64, func(), error) {
		m := c.NewMutex(name, remutex.WithFencing())
		if err := m.LockContext(ctx); err != nil {
			return 0, nil, err
		}
		return m.Fence(), m.Unlock, nil
	}},
	{name: "rwmutex-write", flags: []string{"--write"}, hold: func(ctx context.Context, c *remutex.Client, name string) (int64, func(), error) {
		rw := c.NewRWMutex(name, remutex.WithFencing())
		if err := rw.LockContext(ctx); err != nil {
			return 0, nil, err
		}
		return rw.Fence(), rw.Unlock, nil
	}},
	{name: "semaphore-1", flags: []string{"--permits", "1"}, hold: func(ctx context.Context, c *remutex.Client, name string) (int64, func(), error) {
		s := c.NewSemaphore(name, 1, remutex.WithFencing())
		if err := s.Acquire(ctx, 1); err != nil {
			return 0, nil, err
		}
		return s.Fence(), func() { s.Release(1) }, nil
	}},
}

// TestMixedFleet runs the old remutex command, the new one and Clients of
// the new library on one lock at once, each hold writing to a fenced
// register: the holds must not overlap, their fences must rise, every one
// must be made, the lock must pass from old to new and from new to old
// holders, and no key but the fence counter may be left behind.
func TestMixedFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped under -short: it builds the remutex command of an earlier commit")
	}
	oldBin, newBin := commands(t)
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { mixedFleet(t, k, oldBin, newBin) })
	}
}

const (
	oldProcs   = 2 // runners of the old command, each running it cliRounds times
	newProcs   = 1 // runners of the new command
	cliRounds  = 2
	newClients = 2 // Clients of the new library, each holding libRounds times
	libRounds  = 3
)

func mixedFleet(t *testing.T, k kind, oldBin, newBin string) {
	srv := redistest.Start(t)
	reg := redistest.NewRegister(t)
	prefix := "compat:"
	name := "fleet-" + k.name
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	run := func(bin, who string) error {
		args := append([]string{"run", "--addr", srv.Addr(), "--prefix", prefix, "--fence-env", fenceEnv}, k.flags...)
		args = append(args, name, "--", self)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), childEnv+"="+who, registerEnv+"="+reg.Addr()+" "+reg.Key())
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", who, err, b)
		}
		return nil
	}

	clients := make([]*remutex.Client, newClients)
	for i := range clients {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		clients[i] = remutex.NewClient(rdb, remutex.WithKeyPrefix(prefix))
		t.Cleanup(func() {
			_ = clients[i].Close()
			_ = rdb.Close()
		})
	}

	// A new Client holds the lock while every command queues behind it, so
	// that its release hands the lock to a queued command and the Clients
	// that follow queue behind the commands: the lock passes both ways.
	gateFence, gateRelease, err := k.hold(ctx, clients[0], name)
	if err != nil {
		t.Fatal(err)
	}
	var g group
	runner := func(bin, who string) {
		g.Go(func() error {
			for range cliRounds {
				if err := run(bin, who); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for i := range oldProcs {
		runner(oldBin, fmt.Sprintf("old-cli-%d", i))
	}
	for i := range newProcs {
		runner(newBin, fmt.Sprintf("new-cli-%d", i))
	}
	awaitWaiters(ctx, t, clients[0], name, oldProcs+newProcs)
	for i, c := range clients {
		g.Go(func() error {
			who := fmt.Sprintf("new-lib-%d", i)
			for range libRounds {
				fence, release, err := k.hold(ctx, c, name)
				if err != nil {
					return fmt.Errorf("%s: %v", who, err)
				}
				reg.Enter(who, fence)()
				release()
			}
			return nil
		})
	}
	reg.Enter("new-lib-gate", gateFence)()
	gateRelease()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}

	total := (oldProcs+newProcs)*cliRounds + newClients*libRounds + 1
	reg.CheckSections(t, total)
	accepted, _ := reg.Check(t)
	// The hand-offs between generations, in the order the register saw the
	// holds: both directions must occur, or the test did not exercise the
	// old code granting to the new and the other way round.
	var oldToNew, newToOld int
	for i := 1; i < len(accepted); i++ {
		a, b := strings.HasPrefix(accepted[i-1].Writer, "old-"), strings.HasPrefix(accepted[i].Writer, "old-")
		switch {
		case a && !b:
			oldToNew++
		case !a && b:
			newToOld++
		}
	}
	t.Logf("%d holds, hand-offs old→new %d, new→old %d", len(accepted), oldToNew, newToOld)
	if oldToNew == 0 || newToOld == 0 {
		t.Errorf("hand-offs old→new %d, new→old %d: want both", oldToNew, newToOld)
	}

	// Nothing of the lock may outlive its last holder but the fence
	// counter, which must not go back, and a semaphore's size.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	keys, err := rdb.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if !strings.HasSuffix(key, ":fence") && !strings.HasSuffix(key, ":sem:size") {
			t.Errorf("key %s left behind after the last holder", key)
		}
	}
}

// group runs functions and keeps the first error.
type group struct {
	wg  sync.WaitGroup
	mu  sync.Mutex
	err error
}

func (g *group) Go(f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(); err != nil {
			g.mu.Lock()
			if g.err == nil {
				g.err = err
			}
			g.mu.Unlock()
		}
	}()
}

func (g *group) Wait() error {
	g.wg.Wait()
	return g.err
}

// awaitWaiters returns once the lock's queue holds n waiters, checking after
// each short pause: the commands are other processes, whose queueing this
// process can only observe in Redis.
func awaitWaiters(ctx context.Context, t *testing.T, c *remutex.Client, name string, n int) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := c.Inspect(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Waiters) >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d waiters queued, want %d: %v", len(info.Waiters), n, ctx.Err())
		case <-tick.C:
		}
	}
}
