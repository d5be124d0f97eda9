//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remutex/remutex"
)

// leaderLine is a line of remutex leader, parsed.
type leaderLine struct {
	term  int64
	since time.Time
	host  string
	pid   int
	value string
}

// parseLeaderLine parses a text line of remutex leader: TERM SINCE HOST PID
// VALUE, the value as it is or as a JSON string.
func parseLeaderLine(t testing.TB, line string) leaderLine {
	t.Helper()
	f := strings.SplitN(line, " ", 5)
	if len(f) != 5 {
		t.Fatalf("leader line %q: want TERM SINCE HOST PID VALUE", line)
	}
	var l leaderLine
	var err1, err2, err3 error
	l.term, err1 = strconv.ParseInt(f[0], 10, 64)
	l.since, err2 = time.Parse(sinceLayout, f[1])
	l.host = f[2]
	l.pid, err3 = strconv.Atoi(f[3])
	l.value = f[4]
	if strings.HasPrefix(l.value, `"`) {
		if err := json.Unmarshal([]byte(l.value), &l.value); err != nil {
			t.Fatalf("leader line %q: a quoted value that is no JSON string: %v", line, err)
		}
	}
	if err1 != nil || err2 != nil || err3 != nil || l.since.Location() != time.UTC || l.host == "" {
		t.Fatalf("leader line %q: want a term, a time in UTC, a host and a pid (%v, %v, %v)", line, err1, err2, err3)
	}
	return l
}

// wantLeader fails the test unless remutex leader NAME, in text and in
// JSON, names the leader of value, term and pid, on this host.
func wantLeader(t testing.TB, addr, name, value string, term int64, pid int) leaderLine {
	t.Helper()
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "leader", name)
	if code != 0 || strings.Count(stdout, "\n") != 1 || !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("leader %s: exit status %d, stdout %q, want 0 and one line; stderr:\n%s", name, code, stdout, stderr)
	}
	l := parseLeaderLine(t, strings.TrimSuffix(stdout, "\n"))
	host, _ := os.Hostname()
	if l.term != term || l.value != value || l.pid != pid || !strings.HasPrefix(host, l.host) {
		t.Errorf("leader %s: %+v, want term %d, value %q, pid %d on %s", name, l, term, value, pid, host)
	}

	code, stdout, stderr = run(t, cliEnv(), "", "--addr", addr, "leader", "--json", name)
	var j leaderJSON
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("leader --json %s: exit status %d, stdout %q (%v), want 0 and one JSON object; stderr:\n%s", name, code, stdout, err, stderr)
	}
	if want := (leaderJSON{Name: name, Value: value, Term: term, Since: l.since, Host: l.host, PID: pid, Owner: j.Owner}); j != want || j.Owner == "" {
		t.Errorf("leader --json %s: %+v, want %+v with an owner", name, j, want)
	}
	return l
}

// wantNoLeader fails the test unless remutex leader NAME exits 1, saying
// that nobody leads, with nothing on stdout.
func wantNoLeader(t testing.TB, addr, name string) {
	t.Helper()
	code, stdout, stderr := run(t, cliEnv(), "", "--addr", addr, "leader", name)
	if code != exitNoLeader || stdout != "" || !strings.Contains(stderr, "nobody leads") {
		t.Errorf("leader %s without a leader: exit status %d, stdout %q, stderr %q; want %d, nothing, and \"nobody leads\"", name, code, stdout, stderr, exitNoLeader)
	}
}

// TestLeaderValues: remutex leader prints a leader's value as it is, or as
// a JSON string where the line would not give it back (empty, a space at
// an end, a newline, a leading quote), and --json gives the same; with
// nobody leading it exits 1.
func TestLeaderValues(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		locks := remutex.NewClient(rdbFor(t, b.addr))
		defer locks.Close()
		e := locks.NewElection(name)
		wantNoLeader(t, b.addr, name)
		for _, tt := range []struct{ value, printed string }{
			{"10.0.0.7:8080", "10.0.0.7:8080"},
			{"node a  2", "node a  2"},
			{"", `""`},
			{" padded", `" padded"`},
			{"two\nlines", `"two\nlines"`},
			{`"quoted"`, `"\"quoted\""`},
			{"<ß>", "<ß>"},
		} {
			if err := e.Campaign(ctx, tt.value); err != nil {
				t.Fatal(err)
			}
			wantLeader(t, b.addr, name, tt.value, e.Term(), os.Getpid())
			if _, stdout, _ := run(t, cliEnv(), "", "--addr", b.addr, "leader", name); !strings.HasSuffix(stdout, " "+tt.printed+"\n") {
				t.Errorf("value %q: line %q, want it to end in %s", tt.value, stdout, tt.printed)
			}
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		wantNoLeader(t, b.addr, name)
	})
}

// TestLeaderWatch: leader --watch, in text and in JSON, prints a line for
// each term and each new value, in order, as they come (the test waits for
// each before the next change), until SIGTERM ends it with status 0.
func TestLeaderWatch(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		text := start(t, cliEnv(), "", "--addr", b.addr, "leader", "--watch", name)
		asJSON := start(t, cliEnv(), "", "--addr", b.addr, "leader", "--watch", "--json", name)
		rdb := rdbFor(t, b.addr)
		await(t, 10*time.Second, "both watchers to subscribe", func() bool {
			n, err := rdb.PubSubNumSub(context.Background(), "remutex:{"+name+"}:elect:changed").Result()
			return err == nil && n["remutex:{"+name+"}:elect:changed"] == 2
		})

		type change struct {
			value string
			term  int64
			pid   int
		}
		var want []change
		// seen waits until both watchers printed the changes so far.
		seen := func() {
			t.Helper()
			await(t, 30*time.Second, fmt.Sprintf("%d lines from each watcher", len(want)), func() bool {
				for _, p := range []*proc{text, asJSON} {
					if p.exited() {
						t.Fatalf("watcher exited with status %d; stderr:\n%s", p.cmd.ProcessState.ExitCode(), p.stderr())
					}
				}
				return strings.Count(text.stdout(), "\n") >= len(want) && strings.Count(asJSON.stdout(), "\n") >= len(want)
			})
		}
		out := filepath.Join(t.TempDir(), "term")
		for _, v := range []string{"a", "b c", "d"} {
			p := start(t, cliEnv("OUT="+out), "", "--addr", b.addr, "elect", name, "--value", v, "--", "sh", "-c", `echo "$REMUTEX_TERM" > "$OUT"`)
			if code := p.wait(30 * time.Second); code != 0 {
				t.Fatalf("elect --value %q: exit status %d; stderr:\n%s", v, code, p.stderr())
			}
			term, err := strconv.ParseInt(strings.TrimSpace(readFile(t, out)), 10, 64)
			if err != nil {
				t.Fatalf("REMUTEX_TERM %q: %v", readFile(t, out), err)
			}
			want = append(want, change{v, term, p.cmd.Process.Pid})
			seen()
		}
		// A new value in the same term (Proclaim) is a change too.
		locks := remutex.NewClient(rdb)
		defer locks.Close()
		e := locks.NewElection(name)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := e.Campaign(ctx, "e"); err != nil {
			t.Fatal(err)
		}
		want = append(want, change{"e", e.Term(), os.Getpid()})
		seen()
		if err := e.Proclaim(ctx, "f"); err != nil {
			t.Fatal(err)
		}
		want = append(want, change{"f", e.Term(), os.Getpid()})
		seen()
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}

		for _, p := range []*proc{text, asJSON} {
			p.signal(syscall.SIGTERM)
			if code := p.wait(30 * time.Second); code != 0 {
				t.Errorf("watcher: exit status %d after SIGTERM, want 0; stderr:\n%s", code, p.stderr())
			}
		}
		textLines := strings.Split(strings.TrimSuffix(text.stdout(), "\n"), "\n")
		jsonLines := strings.Split(strings.TrimSuffix(asJSON.stdout(), "\n"), "\n")
		if len(textLines) != len(want) || len(jsonLines) != len(want) {
			t.Fatalf("watchers printed %d and %d lines, want %d:\n%s\n%s", len(textLines), len(jsonLines), len(want), text.stdout(), asJSON.stdout())
		}
		var since time.Time
		for i, w := range want {
			l := parseLeaderLine(t, textLines[i])
			if got := (change{l.value, l.term, l.pid}); got != w {
				t.Errorf("text line %d: %+v, want %+v", i, got, w)
			}
			if l.since.Before(since) || i == len(want)-1 && !l.since.Equal(since) {
				t.Errorf("text line %d: since %v after %v: want later for a new term, the same for a new value", i, l.since, since)
			}
			since = l.since
			var j leaderJSON
			if err := json.Unmarshal([]byte(jsonLines[i]), &j); err != nil {
				t.Fatalf("JSON line %d %q: %v", i, jsonLines[i], err)
			}
			if want := (leaderJSON{Name: name, Value: l.value, Term: l.term, Since: l.since, Host: l.host, PID: l.pid, Owner: j.Owner}); j != want {
				t.Errorf("JSON line %d: %+v, want %+v as the text line says", i, j, want)
			}
		}
	})
}

// TestLeaderForeignKey: data remutex did not write under the election's
// record key is a Redis error (69) for leader and for elect, whose command
// does not run.
func TestLeaderForeignKey(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		key := "remutex:{" + name + "}:elect:leader"
		if err := rdbFor(t, b.addr).HSet(context.Background(), key, "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := run(t, cliEnv(), "", "--addr", b.addr, "leader", name)
		if code != exitRedis || stdout != "" || !strings.Contains(stderr, key) {
			t.Errorf("leader: exit status %d, stdout %q, want %d, nothing, and the key named; stderr:\n%s", code, stdout, exitRedis, stderr)
		}
		ran := filepath.Join(t.TempDir(), "ran")
		code, _, stderr = run(t, cliEnv("RAN="+ran), "", "--addr", b.addr, "elect", name, "--value", "v", "--", "sh", "-c", `echo ran > "$RAN"`)
		if code != exitRedis || !strings.Contains(stderr, key) || readFile(t, ran) != "" {
			t.Errorf("elect: exit status %d, ran: %q, want %d, not run, and the key named; stderr:\n%s", code, readFile(t, ran), exitRedis, stderr)
		}
	})
}
