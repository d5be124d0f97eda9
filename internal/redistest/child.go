package redistest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// A child process is the test binary run again in a role: holders that must
// die or pause (SIGKILL, SIGSTOP) are processes of their own. The child
// writes events to stdout, one a line ("<kind> <fields...>", see Emit), and
// reads commands from stdin, one a line; what the roles are and what they
// do is the test package's. Its TestMain starts the role instead of the
// tests:
//
//	func TestMain(m *testing.M) {
//		if role := redistest.ChildRole(); role != "" {
//			os.Exit(runRole(role))
//		}
//		os.Exit(m.Run())
//	}
const (
	roleEnv     = "REDISTEST_CHILD_ROLE"
	eventPrefix = "REDISTEST "
)

// ChildRole returns the role this process was started in by StartChild, or
// "" in an ordinary test run.
func ChildRole() string { return os.Getenv(roleEnv) }

var emitMu sync.Mutex

// Emit writes one event line to stdout, the fields separated by spaces; it
// is safe to call from any goroutine of a child.
func Emit(kind string, fields ...any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	fmt.Fprintln(os.Stdout, append([]any{strings.TrimSpace(eventPrefix), kind}, fields...)...)
}

// Child is a child process seen from the test.
type Child struct {
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr Buffer
	exited chan struct{} // closed once stdout hit EOF and the process was reaped

	mu     sync.Mutex
	events [][]string // not yet taken
	kick   chan struct{}
}

// StartChild starts the test binary in role, with env ("KEY=value") added to
// this process's environment; id names it in failures. It dies with the
// test binary, and it is killed and reaped at the end of the test.
func StartChild(t testing.TB, role, id string, env ...string) *Child {
	t.Helper()
	return startChild(t, nil, role, id, env)
}

// startChild is StartChild with the command wrap (ip netns exec NS) that
// runs the test binary; nil runs it directly.
func startChild(t testing.TB, wrap []string, role, id string, env []string) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{id: id, exited: make(chan struct{}), kick: make(chan struct{}, 1)}
	argv := append(append([]string(nil), wrap...), exe, "-test.run=^$")
	c.cmd = exec.Command(argv[0], argv[1:]...)
	DieWithParent(c.cmd)
	c.cmd.Env = append(append(os.Environ(), roleEnv+"="+role), env...)
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go c.read(stdout)
	t.Cleanup(func() {
		c.Kill()
		_ = c.stdin.Close()
	})
	return c
}

// read collects the events until stdout closes, then reaps the process.
func (c *Child) read(stdout io.Reader) {
	defer close(c.exited)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), eventPrefix)
		event := strings.Fields(rest)
		if !ok || len(event) == 0 {
			continue
		}
		c.mu.Lock()
		c.events = append(c.events, event)
		c.mu.Unlock()
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	_ = c.cmd.Wait()
}

// ID returns the name given to StartChild.
func (c *Child) ID() string { return c.id }

// Pid returns the process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Stderr returns what the child wrote to stderr so far (a panic's message,
// say).
func (c *Child) Stderr() string { return c.stderr.String() }

// Exited is closed once the child exited and was reaped.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// Send writes one command line to the child.
func (c *Child) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		t.Fatalf("child %s: sending %q: %v", c.id, line, err)
	}
}

// Take removes and returns the fields of the first pending event of kind,
// if there is one.
func (c *Child) Take(kind string) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range c.events {
		if e[0] == kind {
			c.events = append(c.events[:i], c.events[i+1:]...)
			return e[1:], true
		}
	}
	return nil, false
}

// TakeAll removes and returns the fields of every pending event of kind, in
// the order they came.
func (c *Child) TakeAll(kind string) [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var taken [][]string
	kept := c.events[:0]
	for _, e := range c.events {
		if e[0] == kind {
			taken = append(taken, e[1:])
		} else {
			kept = append(kept, e)
		}
	}
	c.events = kept
	return taken
}

// Arrived returns a channel that receives after events arrive: a reader that
// takes them as they come (TakeAll) waits on it. Expect waits on the same
// channel, so one reader at a time.
func (c *Child) Arrived() <-chan struct{} { return c.kick }

// Has reports whether an event of kind is pending.
func (c *Child) Has(kind string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.events {
		if e[0] == kind {
			return true
		}
	}
	return false
}

// Drop discards the pending events of kind.
func (c *Child) Drop(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.events[:0]
	for _, e := range c.events {
		if e[0] != kind {
			kept = append(kept, e)
		}
	}
	c.events = kept
}

// Expect waits for the next event of kind and returns its fields, failing
// the test after timeout or when the child exits first.
func (c *Child) Expect(t testing.TB, kind string, timeout time.Duration) []string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if f, ok := c.Take(kind); ok {
			return f
		}
		select {
		case <-c.kick:
		case <-c.exited:
			if f, ok := c.Take(kind); ok {
				return f
			}
			t.Fatalf("child %s exited before %q (pending %s); stderr:\n%s", c.id, kind, c.pending(), c.stderr.String())
		case <-deadline.C:
			t.Fatalf("child %s: no %q within %v (pending %s); stderr:\n%s", c.id, kind, timeout, c.pending(), c.stderr.String())
		}
	}
}

// pending returns the events not yet taken, for a failure message.
func (c *Child) pending() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.events)
}

// Signal sends sig (SIGSTOP, SIGCONT, ...) to the child.
func (c *Child) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("child %s: %v: %v", c.id, sig, err)
	}
}

// Kill kills the child (a paused one too) and waits until it is reaped.
func (c *Child) Kill() {
	resume(c.cmd.Process)
	_ = c.cmd.Process.Kill()
	<-c.exited
}
