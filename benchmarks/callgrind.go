package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// Instruction counts: redis-server run by valgrind's callgrind tool counts
// every instruction it executes. Unlike time, the count does not move with
// what else runs on the machine: two runs of the same code agree to a
// fraction of a percent, on any machine with the same redis-server build.
//
// A span is counted by zeroing the counters before it (callgrind_control
// -z) and dumping them after it (callgrind_control -d): the dump holds the
// instructions executed in between, by function. redis-server's periodic
// work (serverCron: statistics, memory, clients, active expiry, at hz 10)
// costs instructions in proportion to wall time, and under callgrind the
// server is 20 to 50 times slower, so a span lasts long: serverCron's
// inclusive count is read from the dump and left out. The server's settings
// stay the defaults, so that the locks' semantics (key expiry, the clock the
// scripts read) are those of a production server.
type callgrind struct {
	cmd    *exec.Cmd
	exited chan struct{}
	output *redistest.Buffer // valgrind's and redis-server's
	dir    string            // the server's directory, and the dumps
	parts  int               // the last dump read (dump k is file callgrind.out.k)
	// log is set on a server that dumps after every script call, instead of
	// after each span: it names the calls in the order the server ran them.
	log *scriptLog
}

// The function around every script call (EVAL and EVALSHA), and the periodic
// work left out of the counts.
const (
	scriptFunc = "evalGenericCommand"
	cronFunc   = "serverCron"
)

// startCallgrind starts redis-server under callgrind on a free loopback port,
// without persistence, installing valgrind first if it is missing. perCall
// makes it dump after every script call instead of after each span (see
// scriptLog).
func startCallgrind(perCall bool) (*server, error) {
	if err := ensureValgrind(); err != nil {
		return nil, err
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not on PATH (apt-get install redis-server): %w", err)
	}
	for try := 0; ; try++ { // a port found free may be taken before the server binds it
		s, err := launchCallgrind(bin, perCall)
		if err == nil || try == 2 {
			return s, err
		}
	}
}

// launchCallgrind is one try of startCallgrind.
func launchCallgrind(bin string, perCall bool) (*server, error) {
	port, err := redistest.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "remutex-bench-callgrind-")
	if err != nil {
		return nil, err
	}
	cmd, err := callgrindCommand(bin, dir, port, perCall)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cg := &callgrind{cmd: cmd, exited: make(chan struct{}), output: &redistest.Buffer{}, dir: dir}
	if perCall {
		cg.log = newScriptLog()
	}
	redistest.DieWithParent(cg.cmd)
	cg.cmd.Stdout, cg.cmd.Stderr = cg.output, cg.output
	if err := cg.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = cg.cmd.Wait(); close(cg.exited) }()
	s := &server{addr: "127.0.0.1:" + strconv.Itoa(port), cg: cg}
	if err := cg.await(s); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// callgrindCommand is redis-server under callgrind, in dir, on port.
//
// redis-server seeds the hash function of its dictionaries from
// /dev/urandom at start: whether a command's name (looked up for every
// command, a script's included) shares its bucket of the command table with
// another moves a count by 65 instructions a command, so that the same cycle
// costs up to 1% more on one server than on the next. Where it can (as root,
// in a mount namespace of its own), the server reads a fixed seed instead:
// then every run counts the same. Nothing else that differs between runs
// reaches it either: its arguments and environment are the same byte for
// byte (the directory is the working directory, not an argument; the port
// has five digits).
func callgrindCommand(bin, dir string, port int, perCall bool) (*exec.Cmd, error) {
	args := []string{"valgrind", "--tool=callgrind", "--callgrind-out-file=callgrind.out"}
	if perCall {
		args = append(args, "--zero-before="+scriptFunc, "--dump-after="+scriptFunc)
	}
	args = append(args, bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", ".")
	if fixedSeed() {
		if err := os.WriteFile(filepath.Join(dir, seedFile), seed, 0o644); err != nil {
			return nil, err
		}
		args = append([]string{"unshare", "--mount", "--", "sh", "-c", `mount --bind "$0" /dev/urandom && exec "$@"`, seedFile}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + os.TempDir()}
	return cmd, nil
}

// seed is what the server reads from /dev/urandom where fixedSeed.
var (
	seed     = []byte(strings.Repeat("remutex benchmarks, fixed seed. ", 4))
	seedFile = "urandom"
)

// fixedSeed reports whether this process may give the server a fixed seed:
// start a mount namespace of its own and bind a file over /dev/urandom.
var fixedSeed = sync.OnceValue(func() bool {
	dir, err := os.MkdirTemp("", "remutex-bench-seed-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(dir)
	f := filepath.Join(dir, seedFile)
	if os.WriteFile(f, seed, 0o644) != nil {
		return false
	}
	return command(10*time.Second, "unshare", "--mount", "--", "sh", "-c", `mount --bind "$0" /dev/urandom && cmp -s "$0" /dev/urandom`, f) == nil
})

// await waits until the server answers, for up to a minute (valgrind reads
// the binary's symbols first), and connects s to it for INFO.
func (cg *callgrind) await(s *server) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.connect(slowTimeout)
		if err == nil {
			return nil
		}
		select {
		case <-cg.exited:
			return fmt.Errorf("redis-server under callgrind exited: %v; output:\n%s", err, cg.output)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server under callgrind did not answer within a minute: %w", err)
		}
	}
}

// stop kills the server and waits for it, and removes its directory.
func (cg *callgrind) stop() {
	if cg.cmd.Process != nil {
		_ = cg.cmd.Process.Kill()
		<-cg.exited
	}
	_ = os.RemoveAll(cg.dir)
}

// ensureValgrind installs Debian's valgrind when it is missing, as root.
func ensureValgrind() error {
	if haveValgrind() {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("valgrind is not installed: apt-get install valgrind (as root), or run this as root to install it")
	}
	fmt.Fprintln(os.Stderr, "benchmarks: valgrind missing, installing it with apt-get")
	install := []string{"apt-get", "install", "-y", "--no-install-recommends", "valgrind"}
	if err := command(10*time.Minute, install...); err != nil {
		// The package lists may be missing or stale.
		if err := command(10*time.Minute, "apt-get", "update"); err != nil {
			return err
		}
		if err := command(10*time.Minute, install...); err != nil {
			return err
		}
	}
	if !haveValgrind() {
		return errors.New("valgrind installed, but valgrind or callgrind_control is not on PATH")
	}
	return nil
}

func haveValgrind() bool {
	_, err1 := exec.LookPath("valgrind")
	_, err2 := exec.LookPath("callgrind_control")
	return err1 == nil && err2 == nil
}

// command runs a program, for up to limit, and returns its output with the
// error if it fails.
func command(limit time.Duration, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// control sends callgrind_control's option (-z zero, -d dump) to the server.
func (cg *callgrind) control(option string) error {
	return command(time.Minute, "callgrind_control", option, strconv.Itoa(cg.cmd.Process.Pid))
}

// begin starts a counted span: the counters are zeroed, or, on a server that
// dumps after every script call, the calls are counted from here.
func (cg *callgrind) begin() error {
	if cg.log != nil {
		cg.log.reset()
		last, err := cg.lastPart()
		cg.parts = last
		return err
	}
	return cg.control("-z")
}

// end ends a counted span and returns what it counted.
func (cg *callgrind) end() (counted, error) {
	if cg.log != nil {
		return cg.perCall()
	}
	if err := cg.control("-d"); err != nil {
		return counted{}, err
	}
	last, err := cg.lastPart()
	if err != nil {
		return counted{}, err
	}
	if last != cg.parts+1 {
		return counted{}, fmt.Errorf("callgrind: expected dump %d, found %d", cg.parts+1, last)
	}
	cg.parts = last
	d, err := readDump(cg.part(last))
	if err != nil {
		return counted{}, err
	}
	return counted{Total: d.total, Cron: d.inclusive[cronFunc], Scripts: d.inclusive[scriptFunc]}, nil
}

// perCall pairs the dumps written since begin, one per script call, with the
// calls the clients sent, in the same order: the log let one script call at
// a time reach the server.
func (cg *callgrind) perCall() (counted, error) {
	calls := cg.log.take()
	last, err := cg.lastPart()
	if err != nil {
		return counted{}, err
	}
	if n := last - cg.parts; n != len(calls) {
		return counted{}, fmt.Errorf("callgrind: %d script calls sent, %d dumped", len(calls), n)
	}
	c := counted{calls: map[string]scriptStat{}}
	for i, label := range calls {
		d, err := readDump(cg.part(cg.parts + 1 + i))
		if err != nil {
			return counted{}, err
		}
		c.calls[label] = append(c.calls[label], d.total)
		c.Scripts += d.total
	}
	cg.parts = last
	return c, nil
}

func (cg *callgrind) part(k int) string {
	return filepath.Join(cg.dir, "callgrind.out."+strconv.Itoa(k))
}

// lastPart returns the number of the latest dump, 0 for none.
func (cg *callgrind) lastPart() (int, error) {
	files, err := filepath.Glob(filepath.Join(cg.dir, "callgrind.out.*"))
	if err != nil {
		return 0, err
	}
	var ks []int
	for _, f := range files {
		if k, err := strconv.Atoi(strings.TrimPrefix(filepath.Ext(f), ".")); err == nil {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return 0, nil
	}
	return slices.Max(ks), nil
}

// version returns valgrind's version.
func valgrindVersion() string {
	out, err := exec.Command("valgrind", "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
