//go:build unix

package main

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestUnlockForceStoppedHolder freezes a holder with SIGSTOP: unlock --force
// --yes deletes its lock and wakes a waiting run, and the holder, resumed,
// finds its lease lost, stops its command and exits with status 79.
func TestUnlockForceStoppedHolder(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	name := lockName(t, "lock")
	holder, _, fenceA := holdLock(t, srv.addr(), name, "--lease", "5s")
	holder.signal(syscall.SIGSTOP)

	out := filepath.Join(t.TempDir(), "out")
	waiter := start(t, cliEnv("OUT="+out), "", "--addr", srv.addr(), "run", name, "--", "sh", "-c", `echo "$REMUTEX_FENCE" > "$OUT"`)
	awaitWaiter(t, srv.addr(), name)

	// Subscribed like the waiter, the test sees the release announced.
	ps := rdbFor(t, srv.addr()).Subscribe(context.Background(), "remutex:{"+name+"}:released")
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "unlock", "--force", "--yes", name)
	if code != 0 || !strings.Contains(stdout, "deleted lock") {
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

// assertReleaseMessage waits for the release message "r".
func assertReleaseMessage(t *testing.T, ch <-chan *redis.Message) {
	t.Helper()
	select {
	case msg := <-ch:
		if msg.Payload != "r" {
			t.Errorf("release channel got %q, want \"r\"", msg.Payload)
		}
	case <-time.After(10 * time.Second):
		t.Error("no release message on the lock's channel")
	}
}

// TestUnlockConfirmation checks that unlock asks first: "n" keeps the lock,
// "y" deletes it. Without --force it refuses; a free lock needs nothing.
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
	if code != exitDeclined || !strings.Contains(stderr, "[y/N]") || !strings.Contains(stderr, "not deleted") {
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
