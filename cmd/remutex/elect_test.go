//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// cliBackend is a Redis the binary under test talks to: a miniredis that
// the test process serves, or the shared redis-server.
type cliBackend struct {
	name string
	addr string
	mr   *miniredis.Miniredis // set for miniredis
}

// expire lets keys whose time to live is at most d expire: a miniredis
// expires keys only when told to; a redis-server does so by itself.
func (b cliBackend) expire(d time.Duration) {
	if b.mr != nil {
		b.mr.FastForward(d)
	}
}

// eachCLIBackend runs f, in parallel, on miniredis (unless
// REMUTEX_SERVER_ONLY=1, as for the root package's tests) and on the
// shared redis-server.
func eachCLIBackend(t *testing.T, f func(t *testing.T, b cliBackend)) {
	t.Helper()
	t.Parallel()
	if os.Getenv("REMUTEX_SERVER_ONLY") != "1" {
		t.Run("miniredis", func(t *testing.T) {
			t.Parallel()
			mr := miniredis.RunT(t)
			f(t, cliBackend{name: "miniredis", addr: mr.Addr(), mr: mr})
		})
	}
	t.Run("redis-server", func(t *testing.T) {
		t.Parallel()
		f(t, cliBackend{name: "redis-server", addr: sharedRedis(t).addr()})
	})
}

// candidateScript is the command of the candidates of these tests: it logs
// "start V TERM FENCE PID" when it starts, runs until the file $GATE exists,
// logs "end V" and exits with $STATUS; on SIGTERM it logs "stopped V" and
// exits 0.
const candidateScript = `trap 'echo "stopped $V" >> "$LOG"; exit 0' TERM
echo "start $V $REMUTEX_TERM $REMUTEX_FENCE $$" >> "$LOG"
while [ ! -e "$GATE" ]; do sleep 0.02; done
echo "end $V" >> "$LOG"
exit "${STATUS:-0}"`

// candidate is a remutex elect process running candidateScript.
type candidate struct {
	*proc
	value, log, gate string
}

// startCandidate starts remutex elect NAME --value value on the server at
// addr with candidateScript as its command, logging to log; extra are
// elect's flags (and the connection's, replacing --addr if addr is "") and
// env more variables of the command.
func startCandidate(t testing.TB, addr, name, value, log string, extra []string, env ...string) *candidate {
	t.Helper()
	gate := filepath.Join(t.TempDir(), "gate")
	args := append([]string{"elect"}, extra...)
	if addr != "" {
		args = append([]string{"--addr", addr}, args...)
	}
	args = append(args, name, "--value", value, "--", "sh", "-c", candidateScript)
	p := start(t, cliEnv(append([]string{"LOG=" + log, "GATE=" + gate, "V=" + value}, env...)...), "", args...)
	return &candidate{proc: p, value: value, log: log, gate: gate}
}

// open lets the candidate's running command end.
func (c *candidate) open(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(c.gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// started is a start line of the log: a command that began in a term.
type started struct {
	value      string
	term, pid  int64
	line, seen int // its index among the log's lines; its index among the value's starts
}

// starts returns the log's lines and the start lines among them, checking
// that each start line's term and fence agree.
func starts(t testing.TB, log string) (lines []string, out []started) {
	t.Helper()
	lines = strings.Split(strings.TrimSuffix(readFile(t, log), "\n"), "\n")
	seen := map[string]int{}
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "start" {
			continue
		}
		if len(f) != 5 || f[2] != f[3] {
			t.Fatalf("log line %q: want start VALUE TERM FENCE PID with the fence equal to the term", l)
		}
		term, err1 := strconv.ParseInt(f[2], 10, 64)
		pid, err2 := strconv.ParseInt(f[4], 10, 64)
		if err1 != nil || err2 != nil || term <= 0 {
			t.Fatalf("log line %q: want a positive term and a pid", l)
		}
		out = append(out, started{value: f[1], term: term, pid: pid, line: i, seen: seen[f[1]]})
		seen[f[1]]++
	}
	return lines, out
}

// awaitStart waits until the log shows the n'th start of value's command
// (n from 1) and returns it; it fails if the candidate exits first.
func awaitStart(t testing.TB, c *candidate, n int) started {
	t.Helper()
	var got started
	await(t, 30*time.Second, fmt.Sprintf("start %d of %s's command", n, c.value), func() bool {
		_, all := starts(t, c.log)
		for _, s := range all {
			if s.value == c.value && s.seen == n-1 {
				got = s
				return true
			}
		}
		if c.exited() {
			t.Fatalf("candidate %s exited with status %d before its command started %d times; stderr:\n%s", c.value, c.cmd.ProcessState.ExitCode(), n, c.stderr())
		}
		return false
	})
	return got
}

// awaitCandidate waits until a candidate waits in the election name: it is
// queued in Redis and its Client listens for its grant.
func awaitCandidate(t testing.TB, addr, name string) {
	t.Helper()
	await(t, 10*time.Second, "a candidate queued in election "+name, func() bool {
		st := lockState(t, addr, name).ofKind("election")
		return st.Queued > 0 && st.Subscribers > 0
	})
}

// TestElectRunsWhileLeading: a second candidate's command does not run
// while the first's runs; when the first's command exits, its status is
// remutex's, the term is resigned, and the second's command runs in a
// higher term, which it gets in REMUTEX_TERM and REMUTEX_FENCE.
func TestElectRunsWhileLeading(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		log := filepath.Join(t.TempDir(), "log")
		a := startCandidate(t, b.addr, name, "a", log, nil, "STATUS=7")
		sa := awaitStart(t, a, 1)
		bb := startCandidate(t, b.addr, name, "b", log, nil)
		awaitCandidate(t, b.addr, name)
		if lines, _ := starts(t, log); len(lines) != 1 {
			t.Fatalf("log while a leads and b waits: %q, want a's start only", lines)
		}
		wantLeader(t, b.addr, name, "a", sa.term, a.cmd.Process.Pid)
		if _, waiters := statusTables(t, b.addr, name); len(waiters) != 2 || len(waiters[1]) < 4 || waiters[1][1] != kindElection || waiters[1][3] != "term" {
			t.Errorf("status while b waits: waiters %q, want one row: %s %s <owner> term ...", waiters, name, kindElection)
		}

		a.open(t)
		if code := a.wait(30 * time.Second); code != 7 {
			t.Errorf("a: exit status %d, want its command's 7; stderr:\n%s", code, a.stderr())
		}
		sb := awaitStart(t, bb, 1)
		if sb.term <= sa.term {
			t.Errorf("b's term %d, want above a's %d", sb.term, sa.term)
		}
		wantLeader(t, b.addr, name, "b", sb.term, bb.cmd.Process.Pid)
		bb.open(t)
		if code := bb.wait(30 * time.Second); code != 0 {
			t.Errorf("b: exit status %d, want 0; stderr:\n%s", code, bb.stderr())
		}
		if lines, _ := starts(t, log); strings.Join(lines, "|") != fmt.Sprintf("%s|end a|%s|end b", lines[0], lines[2]) {
			t.Errorf("log: %q, want a's start and end, then b's", lines)
		}
		wantNoLeader(t, b.addr, name)
	})
}

// TestElectLeaderKilled kills the leading remutex with SIGKILL: the waiting
// candidate's command runs once the term's lease (1s) ends, in a higher
// term, and on Linux the killed leader's command dies with it.
func TestElectLeaderKilled(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		log := filepath.Join(t.TempDir(), "log")
		lease := []string{"--lease", "1s"}
		a := startCandidate(t, b.addr, name, "a", log, lease)
		sa := awaitStart(t, a, 1)
		bb := startCandidate(t, b.addr, name, "b", log, lease)
		awaitCandidate(t, b.addr, name)

		a.signal(syscall.SIGKILL)
		killed := time.Now()
		if b.mr != nil {
			// Until the hold of the dead leader expires: a renewal it sent
			// just before it died may reach miniredis after a FastForward.
			await(t, 10*time.Second, "a's term to end", func() bool {
				h := lockState(t, b.addr, name).ofKind("election").Holders
				if len(h) > 0 && h[0].PID == a.cmd.Process.Pid {
					b.expire(time.Second)
					return false
				}
				return true
			})
		}
		sb := awaitStart(t, bb, 1)
		t.Logf("b leads %v after a was killed (lease 1s)", time.Since(killed).Round(time.Millisecond))
		if sb.term <= sa.term {
			t.Errorf("b's term %d, want above a's %d", sb.term, sa.term)
		}
		if runtime.GOOS == "linux" {
			await(t, 10*time.Second, fmt.Sprintf("a's command (pid %d) to die with it", sa.pid), func() bool { return !alive(int(sa.pid)) })
		}
		if fileHas(t, log, "end a") || fileHas(t, log, "stopped a") {
			t.Errorf("a's command ended by itself, not killed with a:\n%s", readFile(t, log))
		}
		bb.open(t)
		if code := bb.wait(30 * time.Second); code != 0 {
			t.Errorf("b: exit status %d, want 0; stderr:\n%s", code, bb.stderr())
		}
	})
}

// TestElectTermLost cuts the leader off from Redis (its connections go
// through a proxy that drops everything): remutex finds its term lost,
// sends the command SIGTERM, and exits with status 79; with --again it
// campaigns again instead and, once the connection is back, runs the
// command again in a higher term, until SIGTERM ends it.
func TestElectTermLost(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		for _, again := range []bool{false, true} {
			t.Run(fmt.Sprintf("again=%v", again), func(t *testing.T) {
				name := lockName(t, "election")
				log := filepath.Join(t.TempDir(), "log")
				proxy := redistest.NewProxy(t, b.addr)
				flags := []string{"--lease", "1s", "--grace", "5s"}
				if again {
					flags = append(flags, "--again")
				}
				a := startCandidate(t, proxy.Addr(), name, "a", log, flags)
				s1 := awaitStart(t, a, 1)

				proxy.SetBlackhole(true)
				await(t, 30*time.Second, "the command to get SIGTERM", func() bool { return fileHas(t, log, "stopped a") })
				if !again {
					proxy.Heal() // (a cut-off Client takes seconds to close)
					if code := a.wait(30 * time.Second); code != exitLost {
						t.Errorf("exit status %d, want %d; stderr:\n%s", code, exitLost, a.stderr())
					}
					if want := fmt.Sprintf("term %d of election %q lost", s1.term, name); !strings.Contains(a.stderr(), want) {
						t.Errorf("stderr does not say %q:\n%s", want, a.stderr())
					}
					return
				}
				b.expire(time.Second) // the lost term's hold, in Redis
				proxy.Heal()
				s2 := awaitStart(t, a, 2)
				if s2.term <= s1.term {
					t.Errorf("term after the loss %d, want above %d", s2.term, s1.term)
				}
				if !strings.Contains(a.stderr(), "campaigning again") {
					t.Errorf("stderr does not say that remutex campaigns again:\n%s", a.stderr())
				}
				a.signal(syscall.SIGTERM) // passed on: the command logs it and exits 0
				if code := a.wait(30 * time.Second); code != 0 {
					t.Errorf("exit status %d after SIGTERM, want the command's 0; stderr:\n%s", code, a.stderr())
				}
				if _, all := starts(t, log); len(all) != 2 {
					t.Errorf("the command started %d times, want 2 (no campaign after SIGTERM):\n%s", len(all), readFile(t, log))
				}
				wantNoLeader(t, b.addr, name)
			})
		}
	})
}

// TestElectAgain: two candidates with --again each run their command again
// in later terms, each term higher than the one before, the waiting one
// first; a signal ends each of them (its campaign with 128+N, or its
// running command, whose status it exits with) and leaves nobody leading.
func TestElectAgain(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		log := filepath.Join(t.TempDir(), "log")
		a := startCandidate(t, b.addr, name, "a", log, []string{"--again"})
		awaitStart(t, a, 1)
		bb := startCandidate(t, b.addr, name, "b", log, []string{"--again"})
		awaitCandidate(t, b.addr, name)
		// Opened, the gates let every later term's command end at once: the
		// candidates take turns.
		a.open(t)
		awaitStart(t, bb, 1)
		bb.open(t)
		awaitStart(t, a, 3)
		awaitStart(t, bb, 3)
		bb.signal(syscall.SIGINT) // waiting (128+2), or its command, which ends at once (0)
		if code := bb.wait(30 * time.Second); code != 128+2 && code != 0 {
			t.Errorf("b: exit status %d after SIGINT, want 130 or 0; stderr:\n%s", code, bb.stderr())
		}
		a.signal(syscall.SIGTERM)
		if code := a.wait(30 * time.Second); code != 128+15 && code != 0 {
			t.Errorf("a: exit status %d after SIGTERM, want 143 or 0; stderr:\n%s", code, a.stderr())
		}
		lines, all := starts(t, log)
		var last int64
		for i, s := range all {
			if s.term <= last {
				t.Errorf("start %d: term %d after %d, want rising:\n%s", i, s.term, last, strings.Join(lines, "\n"))
			}
			last = s.term
		}
		// Later turns depend on who campaigns again first; these two do not.
		if all[0].value != "a" || all[1].value != "b" {
			t.Errorf("the first terms went to %s and %s, want a, then b, which waited:\n%s", all[0].value, all[1].value, strings.Join(lines, "\n"))
		}
		wantNoLeader(t, b.addr, name)
	})
}

// TestElectArguments: command lines elect would misread are usage errors
// (status 64, one line, nothing run, Redis never reached), and flags may
// stand before and after NAME.
func TestElectArguments(t *testing.T) {
	t.Parallel()
	ran := filepath.Join(t.TempDir(), "ran")
	record := []string{"sh", "-c", `echo ran >> "$RAN"`}
	for _, tt := range []struct {
		args   []string
		stderr string
	}{
		{append([]string{"elect", "--value", "v", "--"}, record...), "no election name before --"},
		{[]string{"elect"}, "no election name"},
		{[]string{"elect", "x", "--value", "v"}, "no command"},
		{append([]string{"elect", "x", "--"}, record...), "no --value"},
		{append([]string{"elect", "x", "--value", "v", "y", "--"}, record...), `"y" between the election name "x" and --`},
		{append([]string{"elect", "--value", "v", "--lease", "10ms", "x", "--"}, record...), "--lease 10ms"},
		{append([]string{"elect", "--value", "v", "--fence-env", "A-B", "x", "--"}, record...), `--fence-env "A-B" is not a variable name`},
		{append([]string{"elect", "--value", "v", "}x", "--"}, record...), `lock name "}x" starts with '}'`},
		{append([]string{"elect", "x", "--value", "v", "--nope", "--"}, record...), "flag provided but not defined: --nope"},
		{[]string{"leader"}, "want one election name, got 0"},
		{[]string{"leader", "x", "y"}, "want one election name, got 2"},
		{[]string{"leader", ""}, "empty lock name"},
	} {
		code, _, stderr := run(t, cliEnv("REDIS_ADDR=127.0.0.1:1", "RAN="+ran), "", tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.stderr) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("remutex %q: exit status %d, want %d with one line mentioning %q; stderr:\n%s", tt.args, code, exitUsage, tt.stderr, stderr)
		}
	}
	if got := readFile(t, ran); got != "" {
		t.Errorf("a command ran after a usage error: %q", got)
	}

	// Flags after NAME, the --fence-env variable, and a command not found.
	srv := sharedRedis(t)
	name := lockName(t, "election")
	code, _, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "elect", name, "--value", "v", "--fence-env", "TOKEN", "--lease", "5s", "--",
		"sh", "-c", `test -n "$REMUTEX_TERM" && test "$TOKEN" = "$REMUTEX_TERM" && test -z "$REMUTEX_FENCE"`)
	if code != 0 {
		t.Errorf("elect NAME --value v --fence-env TOKEN: exit status %d, want 0; stderr:\n%s", code, stderr)
	}
	if code, _, stderr := run(t, cliEnv(), "", "--addr", srv.addr(), "elect", "--value", "v", name, "--", "remutex-test-no-such-command"); code != exitNotFound {
		t.Errorf("a command not found: exit status %d, want %d; stderr:\n%s", code, exitNotFound, stderr)
	}
	for _, tt := range []struct{ args, want []string }{
		{[]string{"help", "elect"}, []string{"Usage: remutex elect", "-again", "-value"}},
		{[]string{"elect", "-h"}, []string{"Usage: remutex elect"}},
		{[]string{"help", "leader"}, []string{"Usage: remutex leader", "-json", "-watch"}},
	} {
		code, stdout, stderr := run(t, cliEnv(), "", tt.args...)
		for _, w := range tt.want {
			if code != 0 || !strings.Contains(stdout, w) {
				t.Errorf("remutex %q: exit status %d, want 0 with %q on stdout; stderr:\n%s", tt.args, code, w, stderr)
			}
		}
	}
}

// TestElectInterruptedWhileCampaigning: SIGTERM ends the campaign of a
// waiting candidate with 128+15, without running its command or leaving it
// queued.
func TestElectInterruptedWhileCampaigning(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		log := filepath.Join(t.TempDir(), "log")
		a := startCandidate(t, b.addr, name, "a", log, nil)
		awaitStart(t, a, 1)
		bb := startCandidate(t, b.addr, name, "b", log, nil)
		awaitCandidate(t, b.addr, name)
		bb.signal(syscall.SIGTERM)
		if code := bb.wait(30 * time.Second); code != 128+15 {
			t.Errorf("b: exit status %d, want %d; stderr:\n%s", code, 128+15, bb.stderr())
		}
		if st := lockState(t, b.addr, name).ofKind("election"); st.Queued != 0 {
			t.Errorf("%d candidates queued after b left, want 0", st.Queued)
		}
		a.open(t)
		if code := a.wait(30 * time.Second); code != 0 {
			t.Errorf("a: exit status %d, want 0; stderr:\n%s", code, a.stderr())
		}
		if _, all := starts(t, log); len(all) != 1 {
			t.Errorf("%d commands started, want a's only:\n%s", len(all), readFile(t, log))
		}
	})
}

// TestElectCluster runs two candidates and a watcher on a Redis Cluster
// (on Redis 7 the changes are shard messages): the waiting candidate leads
// when the first one's command exits, and the watcher prints both terms.
func TestElectCluster(t *testing.T) {
	t.Parallel()
	srv := startCluster(t)
	cluster := []string{"--cluster", srv.addr()}
	name := lockName(t, "election")
	log := filepath.Join(t.TempDir(), "log")
	a := startCandidate(t, "", name, "a", log, cluster)
	sa := awaitStart(t, a, 1)
	watch := start(t, cliEnv(), "", append(cluster, "leader", "--watch", name)...)
	await(t, 30*time.Second, "the watcher to print the leader", func() bool { return strings.Contains(watch.stdout(), "\n") })
	bb := startCandidate(t, "", name, "b", log, cluster)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.addr()}})
	t.Cleanup(func() { _ = cc.Close() })
	await(t, 10*time.Second, "b to queue", func() bool {
		st := lockStateOn(t, cc, name).ofKind("election")
		return st.Queued > 0 && st.Subscribers > 0
	})
	a.open(t)
	sb := awaitStart(t, bb, 1)
	bb.open(t)
	for _, p := range []*candidate{a, bb} {
		if code := p.wait(30 * time.Second); code != 0 {
			t.Errorf("%s: exit status %d, want 0; stderr:\n%s", p.value, code, p.stderr())
		}
	}
	await(t, 30*time.Second, "the watcher to print b", func() bool { return strings.Count(watch.stdout(), "\n") >= 2 })
	watch.signal(syscall.SIGTERM)
	if code := watch.wait(30 * time.Second); code != 0 {
		t.Errorf("watcher: exit status %d, want 0; stderr:\n%s", code, watch.stderr())
	}
	lines := strings.Split(strings.TrimSuffix(watch.stdout(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("watcher printed %q, want a line for a's term and one for b's", lines)
	}
	for i, w := range []started{sa, sb} {
		if l := parseLeaderLine(t, lines[i]); l.term != w.term || l.value != w.value {
			t.Errorf("watcher line %d: term %d value %q, want %d %q", i, l.term, l.value, w.term, w.value)
		}
	}
}

// TestElectAgainAfterFailure: with --again, a command that fails hands the
// term on (the waiting candidate leads) and remutex says that it will
// campaign again; a signal then ends it with 128+N, and its command does
// not run again.
func TestElectAgainAfterFailure(t *testing.T) {
	eachCLIBackend(t, func(t *testing.T, b cliBackend) {
		name := lockName(t, "election")
		log := filepath.Join(t.TempDir(), "log")
		a := startCandidate(t, b.addr, name, "a", log, []string{"--again"}, "STATUS=3")
		awaitStart(t, a, 1)
		bb := startCandidate(t, b.addr, name, "b", log, nil)
		awaitCandidate(t, b.addr, name)
		a.open(t)
		awaitStart(t, bb, 1)
		await(t, 10*time.Second, "a to say that it campaigns again", func() bool {
			return strings.Contains(a.stderr(), "the command exited with status 3; campaigning again")
		})
		a.signal(syscall.SIGTERM)
		if code := a.wait(30 * time.Second); code != 128+15 {
			t.Errorf("a: exit status %d after SIGTERM, want %d; stderr:\n%s", code, 128+15, a.stderr())
		}
		bb.open(t)
		if code := bb.wait(30 * time.Second); code != 0 {
			t.Errorf("b: exit status %d, want 0; stderr:\n%s", code, bb.stderr())
		}
		if _, all := starts(t, log); len(all) != 2 {
			t.Errorf("%d commands started, want a's and then b's:\n%s", len(all), readFile(t, log))
		}
		if st := lockState(t, b.addr, name).ofKind("election"); st.Queued != 0 || st.Held {
			t.Errorf("election after both left: held %v, %d queued; want free, nobody queued", st.Held, st.Queued)
		}
	})
}
