package main

import (
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestMain makes the test binary a replica when a test below starts it as
// one: os.Executable is the test binary then.
func TestMain(m *testing.M) {
	if js := os.Getenv(replicaEnv); js != "" {
		os.Exit(replicaMain(js))
	}
	os.Exit(m.Run())
}

// TestHandOver runs the example as its command line would (three replica
// processes, this test binary started again, see TestMain) on an embedded
// miniredis, on a redis-server of its own, and on REDIS_ADDR if set, and
// checks its exit status and the lines that show the election: the
// replicas campaign, the followers see who leads, the leader is killed and
// another leads after it, the next leaders resign, and the verdict is ok.
func TestHandOver(t *testing.T) {
	type backend struct {
		name string
		addr func(t *testing.T) string // "" for an embedded miniredis
	}
	backends := []backend{
		{"miniredis", func(*testing.T) string { return "" }},
		{"redis-server", func(t *testing.T) string { return redistest.Start(t).Addr() }},
	}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		backends = append(backends, backend{"REDIS_ADDR", func(*testing.T) string { return addr }})
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Setenv("REDIS_ADDR", b.addr(t))
			var out, errOut strings.Builder
			status := cli([]string{"-lease", "1s", "-every", "100ms", "-jobs", "2"}, &out, &errOut)
			t.Log("\n" + out.String() + errOut.String())
			if status != 0 {
				t.Fatalf("got exit status %d, want 0", status)
			}
			for _, want := range []struct {
				line  string
				count int
			}{
				{" campaigns (pid ", 3},
				{" sees replica-", 1},
				{"--          SIGKILL to replica-", 1},
				{" leases (", 1}, // the hand-over after the SIGKILL
				{"--          SIGTERM to replica-", 2},
				// More than 3 terms if a term was lost to a stalled watchdog.
				{"\nterms:      ", 1},
				{"\nregister:   ", 1},
				{"\nverdict:    ok: ", 1},
				{" after a Resign\n", 1}, // the hand-over after the first SIGTERM
			} {
				if got := strings.Count(out.String(), want.line); got < want.count {
					t.Errorf("%q: got %d lines, want %d at least", want.line, got, want.count)
				}
			}
		})
	}
}

// TestBadFlags checks that a configuration the example cannot run exits
// with status 2 before it starts anything.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-replicas", "1"}, {"-lease", "1ms"}, {"-every", "0s"}, {"-jobs", "0"}, {"-no-such-flag"}} {
		if got := cli(args, io.Discard, io.Discard); got != 2 {
			t.Errorf("%v: got exit status %d, want 2", args, got)
		}
	}
}

// TestVerdict checks the verdict, on which the exit status depends: two
// terms that overlap, a term going back at the register, a refused write,
// or no hand-over after the SIGKILL are a FAIL.
func TestVerdict(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	sound := func() []*span {
		return []*span{
			{term: 10, id: 1, since: 1000, start: at(0), end: at(500), stoppedBy: "SIGKILL"},
			{term: 11, id: 2, since: 2400, start: at(1400), end: at(1900), ended: true, stoppedBy: "SIGTERM"},
			{term: 12, id: 3, since: 2901, start: at(1901), end: at(2400), ended: true, stoppedBy: "SIGTERM"},
		}
	}
	writes := []write{{10, 1, 1, 1001, true}, {10, 1, 2, 1201, true}, {11, 2, 1, 2401, true}, {12, 3, 1, 2901, true}}

	late := append([]write{}, writes...)
	late[1].at = 2401 // term 10 wrote after term 11 began, before term 11 wrote
	open := sound()
	open[2].ended = false
	back := append([]write{}, writes...)
	back[2], back[3] = back[3], back[2]
	refused := append([]write{}, writes...)
	refused[3].ok = false
	lost := sound() // the first term was lost, not killed: no hand-over after a SIGKILL
	lost[0].stoppedBy, lost[0].ended = "", true
	for _, tc := range []struct {
		name   string
		spans  []*span
		writes []write
		want   string
	}{
		{"sound", sound(), writes, "ok: one leader at a time, the register saw the terms only rise; the next leader led 0.90 leases after the SIGKILL, 1ms after a Resign"},
		{"a write after a later term began", sound(), late, "FAIL: two leaders at once: replica-1 wrote with term 10 at 00:00:02.401, after replica-2's term 11 began at 00:00:02.400"},
		{"a write in the millisecond a later term began", sound(), writes, "ok: "},
		{"a term never ended", open, writes, "FAIL: term 12 of replica-3 never ended"},
		{"term back", sound(), back, "FAIL: a term went back at the register: its write 4, by replica-2, has term 11 after term 12"},
		{"refused", sound(), refused, "FAIL: a term went back at the register: its write 4"},
		{"no SIGKILL", lost, writes, "FAIL: nobody led after the SIGKILL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := verdict(tc.spans, tc.writes, time.Second); !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want it to start with %q", got, tc.want)
			}
		})
	}
}
