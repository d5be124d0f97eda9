//go:build unix

package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestRunTerminal runs remutex on a pseudo-terminal (script(1) provides one):
// the command, in the terminal's foreground, reads what is typed, and Ctrl-C
// reaches it once.
func TestRunTerminal(t *testing.T) {
	t.Parallel()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Skip("script(1) not on PATH (util-linux): cannot give remutex a terminal")
	}
	srv := sharedRedis(t)
	bin := binary(t)
	quote := strconv.Quote

	t.Run("reads the terminal", func(t *testing.T) {
		t.Parallel()
		name := lockName(t, "lock")
		cmdline := bin + " --addr " + srv.addr() + " run " + quote(name) + ` -- sh -c 'read line; echo "got $line"'`
		out, code := onTerminal(t, script, cmdline, func(typed func(string)) { typed("hello\n") }, nil)
		if code != 0 || !strings.Contains(out, "got hello") {
			t.Errorf("exit status %d, want 0, and the command should have read the line; terminal:\n%s", code, out)
		}
	})

	t.Run("Ctrl-C reaches the command once", func(t *testing.T) {
		t.Parallel()
		name := lockName(t, "lock")
		log := filepath.Join(t.TempDir(), "log")
		cmdline := bin + " --addr " + srv.addr() + " run " + quote(name) + " -- sh -c " +
			quote(`trap 'echo got INT >> "$LOG"; exit 5' INT; echo ready >> "$LOG"; while :; do sleep 0.05; done`)
		out, code := onTerminal(t, script, cmdline, func(typed func(string)) {
			await(t, 30*time.Second, "the command to start", func() bool { return fileHas(t, log, "ready") })
			typed("\x03")
		}, []string{"LOG=" + log})
		if code != 5 {
			t.Errorf("exit status %d, want the command's 5; terminal:\n%s", code, out)
		}
		if n := strings.Count(readFile(t, log), "got INT"); n != 1 {
			t.Errorf("the command saw SIGINT %d times, want once; terminal:\n%s", n, out)
		}
	})
}

// onTerminal runs cmdline under script(1) on a new pseudo-terminal, lets type
// write to the terminal, and returns what the terminal showed and the exit
// status of cmdline.
func onTerminal(t *testing.T, script, cmdline string, typing func(typed func(string)), env []string) (string, int) {
	t.Helper()
	cmd := exec.Command(script, "-qec", cmdline, "/dev/null")
	cmd.Env = cliEnv(env...)
	var out redistest.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	typing(func(s string) {
		if _, err := stdin.Write([]byte(s)); err != nil {
			t.Errorf("typing %q: %v", s, err)
		}
	})
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("still running after 30s; terminal so far:\n%s", out.String())
	}
	_ = stdin.Close()
	return out.String(), cmd.ProcessState.ExitCode()
}
