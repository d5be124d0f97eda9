//go:build unix

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestUnlockForceStoppedHolder freezes a holder with SIGSTOP: unlock --force
// --yes releases its lock and wakes a waiting run with a message to its
// Client, as an unlock would, and the holder, resumed, finds its lease lost,
// stops its command and exits with status 79.
func TestUnlockForceStoppedHolder(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	// A lease that outlasts the steps up to unlock --force on a busy
	// machine: the stopped holder must still hold then.
	holder, _, fenceA := holdLock(t, srv.addr(), name, "--lease", "30s")
	holder.signal(syscall.SIGSTOP)

	out := filepath.Join(t.TempDir(), "out")
	waiter := start(t, cliEnv("OUT="+out), "", "--addr", srv.addr(), "run", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`)
	awaitWaiter(t, srv.addr(), name)

	// Listening on the lock's channels, the test sees the waiter's Client
	// told.
	ps := rdbFor(t, srv.addr()).PSubscribe(context.Background(), "remutex:{"+name+"}:released:*")
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "released lock") {
		t.Fatalf("unlock: exit status %d, want 0; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	assertReleaseMessage(t, ps.Channel())
	if code := waiter.wait(30 * time.Second); code != 0 {
		t.Fatalf("waiter: exit status %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	if fenceB, err := strconv.ParseInt(strings.TrimSpace(readFile(t, out)), 10, 64); err != nil || fenceB <= fenceA {
		t.Errorf("waiter's fencing token %q, want a number above the holder's %d", readFile(t, out), fenceA)
	}

	holder.signal(syscall.SIGCONT)
	if code := holder.wait(30 * time.Second); code != exitLost {
		t.Errorf("resumed holder: exit status %d, want %d; stderr:\n%s", code, exitLost, holder.stderr())
	}
}

// assertReleaseMessage waits for the message a release sends the Client of
// the lock's longest waiter: a wake-up ("w <entry>") or a grant ("g <fence>
// <entry>").
func assertReleaseMessage(t *testing.T, ch <-chan *redis.Message) {
	t.Helper()
	select {
	case msg := <-ch:
		if !regexp.MustCompile(`^(w|g \d+) \d+:`).MatchString(msg.Payload) {
			t.Errorf("the waiter's Client got %q, want a wake-up or a grant", msg.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Error("no message to the waiter's Client")
	}
}

// TestUnlockConfirmation checks that unlock asks first: "n" keeps the lock,
// "y" releases it. Without --force it refuses; a free lock needs nothing.
func TestUnlockConfirmation(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	holder, _, _ := holdLock(t, srv.addr(), name, "--lease", "2s")

	code, _, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "unlock", name)
	if code != exitUsage || !strings.Contains(stderr, "--force") {
		t.Errorf("without --force: exit status %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}
	code, _, stderr = run(t, cliEnv(), "n\n", "--addr", srv.addr(), "unlock", "--force", name)
	if code != exitDeclined || !strings.Contains(stderr, "[y/N]") || !strings.Contains(stderr, "not released") ||
		!strings.Contains(stderr, fmt.Sprintf("(pid %d on ", holder.cmd.Process.Pid)) {
		t.Errorf("answered n: exit status %d, want %d; stderr:\n%s", code, exitDeclined, stderr)
	}
	if !lockState(t, srv.addr(), name).Held {
		t.Fatal("answered n, yet the lock is gone")
	}
	code, _, stderr = run(t, cliEnv(), "y\n", "--addr", srv.addr(), "unlock", "--force", name)
	if code != 0 {
		t.Errorf("answered y: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	if code := holder.wait(30 * time.Second); code != exitLost {
		t.Errorf("holder: exit status %d, want %d; stderr:\n%s", code, exitLost, holder.stderr())
	}
	code, stdout, _ := run(t, cliEnv(), "", "--addr", srv.addr(), "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "not held") {
		t.Errorf("free lock: exit status %d, want 0; stdout:\n%s", code, stdout)
	}
}
