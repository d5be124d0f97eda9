//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStatusJSON reads status --json for a held lock with a queued waiter, a
// free lock and a key that is not a lock.
func TestStatusJSON(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	held, free, str := lockName(t, "held"), lockName(t, "free"), lockName(t, "string")
	holder, _, fence := holdLock(t, srv.addr(), held, "--lease", "5s")
	waiter := start(t, cliEnv(), "", "--addr", srv.addr(), "run", held, "--", "true")
	await(t, 10*time.Second, "the waiter to queue", func() bool { return lockState(t, srv.addr(), held).Queued == 1 })

	code, stdout, stderr := run(t, cliEnv("REDIS_ADDR="+srv.addr()), "", "status", held, "--json", free)
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	var got []lockStatus
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("status --json output is not a JSON array of locks: %v\n%s", err, stdout)
	}
	if len(got) != 2 {
		t.Fatalf("got %d locks, want 2:\n%s", len(got), stdout)
	}
	h := got[0]
	switch {
	case h.Name != held || h.Key != "remutex:{"+held+"}" || !h.Held:
		t.Errorf("held lock: name %q key %q held %v, want %q, %q, true", h.Name, h.Key, h.Held, held, "remutex:{"+held+"}")
	case len(h.Holders) != 1 || h.Holders[0].Count != 1 || !regexp.MustCompile(`^[A-Za-z0-9_-]{22}\.[A-Za-z0-9._-]+\.\d+:\d+\.\d+$`).MatchString(h.Holders[0].Owner):
		t.Errorf("holders %+v, want one owner <22 base64url>.<host>.<pid>:<goroutine id>.<n> with count 1", h.Holders)
	case h.Holders[0].PID != holder.cmd.Process.Pid || h.Holders[0].Host == "" ||
		!strings.Contains(h.Holders[0].Owner, fmt.Sprintf(".%s.%d:", h.Holders[0].Host, h.Holders[0].PID)):
		t.Errorf("holder %+v: want the host and pid (%d) of the holding remutex, as in its owner token", h.Holders[0], holder.cmd.Process.Pid)
	case h.TTLMillis <= 0 || h.TTLMillis > 5000:
		t.Errorf("ttl_ms %d, want within the 5s lease", h.TTLMillis)
	case h.Fence != fence:
		t.Errorf("fence %d, want the holder's token %d", h.Fence, fence)
	case h.Queued != 1 || h.Subscribers != 1:
		t.Errorf("queued %d, subscribers %d; want 1 and 1 (the waiting run)", h.Queued, h.Subscribers)
	case len(h.Waiters) != 1 || h.Waiters[0].PID != waiter.cmd.Process.Pid || h.Waiters[0].Read || h.Waiters[0].Permits != 0 ||
		h.Waiters[0].Since.After(time.Now()) || !strings.Contains(h.Waiters[0].Owner, fmt.Sprintf(".%d:", waiter.cmd.Process.Pid)):
		t.Errorf("waiters %+v, want the waiting run (pid %d), not a reader, no permits, waiting since before now", h.Waiters, waiter.cmd.Process.Pid)
	}
	f := got[1]
	if f.Name != free || f.Held || len(f.Holders) != 0 || f.TTLMillis != 0 || f.Fence != 0 || f.Queued != 0 || len(f.Waiters) != 0 || f.Size != 0 || f.Error != "" {
		t.Errorf("free lock: got %+v, want not held, no holders, ttl 0, fence 0, nothing queued, size 0", f)
	}
	if !strings.Contains(stdout, `"waiters": []`) {
		t.Errorf("a free lock's waiters should be an empty array, not null:\n%s", stdout)
	}
	if !strings.Contains(stdout, `"kept": false`) {
		t.Errorf("a held lock's holder should say \"kept\": false:\n%s", stdout)
	}
	if !strings.Contains(stdout, `"holders": []`) {
		t.Errorf("a free lock's holders should be an empty array, not null:\n%s", stdout)
	}

	// The tables for people show the same: the locks, then the waiters.
	code, stdout, _ = run(t, cliEnv(), "", "status", "--addr", srv.addr(), held, free)
	locks, waiting, _ := strings.Cut(strings.TrimSpace(stdout), "\n\n")
	lines := strings.Split(locks, "\n")
	header := "NAME STATE KIND HOLDER MODE HOST PID COUNT TTL FENCE QUEUED WRITERS-WAITING SUBSCRIBERS"
	held1 := fmt.Sprintf("%s held mutex %s - %s %d 1", held, h.Holders[0].Owner, h.Holders[0].Host, h.Holders[0].PID)
	if code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != header ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), held1+" ") || !strings.Contains(lines[2], "free") {
		t.Errorf("status: exit %d, output:\n%s", code, stdout)
	}
	lines = strings.Split(waiting, "\n")
	waiter1 := fmt.Sprintf("%s mutex %s lock %s %d ", held, "<owner>", h.Holders[0].Host, waiter.cmd.Process.Pid)
	if len(h.Waiters) == 1 {
		waiter1 = fmt.Sprintf("%s mutex %s lock %s %d ", held, h.Waiters[0].Owner, h.Waiters[0].Host, waiter.cmd.Process.Pid)
	}
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME KIND WAITER WANTS HOST PID WAITING" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), waiter1) {
		t.Errorf("status: want a table of waiters after the locks, with one line %q...; output:\n%s", waiter1, stdout)
	}

	// A key of another type under a lock's name is reported, and untouched.
	rdb := rdbFor(t, srv.addr())
	if err := rdb.Set(context.Background(), "remutex:{"+str+"}", "data", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = run(t, cliEnv(), "", "--addr", srv.addr(), "status", "--json", str)
	if code != exitRedis || !strings.Contains(stdout, `"error": "key \"remutex:{`+str+`}\" holds a string, not a remutex lock"`) || !strings.Contains(stderr, "not a remutex lock") {
		t.Errorf("string key: exit %d, want %d; stdout:\n%s\nstderr:\n%s", code, exitRedis, stdout, stderr)
	}
	if v, err := rdb.Get(context.Background(), "remutex:{"+str+"}").Result(); err != nil || v != "data" {
		t.Errorf("string key now %q (%v), want it untouched", v, err)
	}

	holder.signal(syscall.SIGTERM)
	holder.wait(30 * time.Second)
	if code := waiter.wait(30 * time.Second); code != 0 {
		t.Errorf("waiter: exit status %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
}

// TestStatusAlignsWideNames checks the table's columns with names whose
// bytes, runes and terminal columns differ: accented letters (precomposed
// and with a combining mark) and CJK characters, two columns each.
func TestStatusAlignsWideNames(t *testing.T) {
	t.Parallel()
	srv := sharedRedis(t)
	prefix := lockName(t, "") // ASCII: one column a byte
	names := []struct {
		suffix string
		width  int // terminal columns
	}{
		{"ascii", 5},
		{"größe-ü", 7},
		{"gro\u0308sse", 6}, // o and a combining diaeresis
		{"錠前-ロック", 11},
	}
	args := []string{"--addr", srv.addr(), "status"}
	col := 0
	for _, n := range names {
		args = append(args, prefix+n.suffix)
		col = max(col, len(prefix)+n.width)
	}
	col += 2 // the gap between columns
	code, stdout, stderr := run(t, cliEnv(), "", args...)
	if code != 0 {
		t.Fatalf("exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != len(names)+1 {
		t.Fatalf("got %d lines, want a header and %d locks:\n%s", len(lines), len(names), stdout)
	}
	if want := "NAME" + strings.Repeat(" ", col-4) + "STATE  "; !strings.HasPrefix(lines[0], want) {
		t.Errorf("header %q, want it to start %q", lines[0], want)
	}
	for i, n := range names {
		want := prefix + n.suffix + strings.Repeat(" ", col-len(prefix)-n.width) + "free   "
		if !strings.HasPrefix(lines[i+1], want) {
			t.Errorf("line %d: %q, want it to start %q (STATE at column %d)", i+2, lines[i+1], want, col)
		}
	}
}
