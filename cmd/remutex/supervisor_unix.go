//go:build unix

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// remutex run does not start the command itself. It starts a supervisor, a
// second remutex process (this binary, run again with supervisorEnv set),
// which starts the command in a process group of its own and answers for
// every process in that group:
//
//   - remutex passes signals to it over a pipe (the supervisor's fd 3), and
//     the supervisor sends them to the whole group;
//   - when the command exits, processes it left behind in the group get
//     SIGTERM, then SIGKILL after --grace, and the supervisor exits with the
//     command's status only once the group is empty, so remutex releases the
//     lock only after every process of the command is gone;
//   - when remutex dies, by SIGKILL or otherwise, the pipe closes and the
//     supervisor kills the group with SIGKILL at once, since nobody renews
//     the lease any more. On Linux the supervisor also gets a parent-death
//     signal and adopts the command's orphans (it is a child subreaper), so
//     that it can reap them and see the group empty.
//
// The supervisor is in a process group of its own too: a signal sent to
// remutex's group (a shell's job control, timeout(1)) reaches remutex, which
// passes it on once, and cannot kill the supervisor along with remutex.
//
// A process that leaves the group on purpose (setsid, setpgid: daemons do)
// is out of reach.

// supervisorEnv names the variable that starts remutex as a supervisor. Its
// value is "<remutex's pid>:<grace>:<foreground>"; the command's path and
// arguments follow in os.Args.
const supervisorEnv = "REMUTEX_SUPERVISOR"

// Timing of the supervisor's clean-up: how often it looks whether the
// command's group is empty, and how long it waits for that after SIGKILL
// before it gives up (a process stuck in the kernel cannot die sooner).
const (
	groupPoll     = 10 * time.Millisecond
	killedTimeout = 10 * time.Second
)

// supervisorSpec is what remutex tells its supervisor.
type supervisorSpec struct {
	parent     int           // remutex's pid
	grace      time.Duration // SIGTERM to SIGKILL for processes left behind
	foreground bool          // make the command's group the terminal's foreground
}

func (s supervisorSpec) String() string {
	fg := 0
	if s.foreground {
		fg = 1
	}
	return fmt.Sprintf("%d:%s:%d", s.parent, s.grace, fg)
}

func parseSupervisorSpec(v string) (supervisorSpec, error) {
	var s supervisorSpec
	f := strings.Split(v, ":")
	if len(f) != 3 {
		return s, fmt.Errorf("%s=%q: want pid:grace:foreground", supervisorEnv, v)
	}
	var err1, err2 error
	s.parent, err1 = strconv.Atoi(f[0])
	s.grace, err2 = time.ParseDuration(f[1])
	s.foreground = f[2] == "1"
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("%s=%q: %w", supervisorEnv, v, err)
	}
	return s, nil
}

// withoutSupervisorEnv returns env without supervisorEnv.
func withoutSupervisorEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, supervisorEnv+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// supervisorMain runs remutex as a supervisor if the environment says so,
// and returns its exit status.
func supervisorMain() (code int, ok bool) {
	v, ok := os.LookupEnv(supervisorEnv)
	if !ok {
		return 0, false
	}
	spec, err := parseSupervisorSpec(v)
	if err != nil || len(os.Args) < 3 {
		fmt.Fprintf(os.Stderr, "remutex: supervisor: bad invocation (%v); it is started by remutex run\n", err)
		return exitUsage, true
	}
	return runSupervisor(spec, os.Args[1], os.Args[2:]), true
}

// runSupervisor starts the command path with argv and supervises its process
// group. It returns the command's status (128+N if signal N killed it), or
// 126/127 if it could not be started.
func runSupervisor(spec supervisorSpec, path string, argv []string) int {
	// Catch what would otherwise kill the supervisor, before anything else.
	// Handled signals are reset to their defaults for the command, which so
	// gets default dispositions even if remutex was started with SIGHUP or
	// SIGINT ignored (nohup). A caught signal here only means: check that
	// remutex still runs (the parent-death signal is one of them).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGPIPE)
	defer signal.Stop(sigs)

	ctl, err := controlPipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "remutex: supervisor: %v\n", err)
		return exitCannotRun
	}
	defer ctl.Close()
	adoptOrphans()
	if os.Getppid() != spec.parent {
		// remutex died before it could be told of it; its lock is going.
		return 128 + int(syscall.SIGKILL)
	}

	attr := &syscall.SysProcAttr{Setpgid: true}
	if spec.foreground {
		attr.Foreground, attr.Ctty = true, 0
	}
	p, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   withoutSupervisorEnv(os.Environ()),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   attr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "remutex: %v\n", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	g := &group{pgid: p.Pid, spec: spec}
	_ = p.Release() // reaped with wait4 below, not through p
	return g.supervise(ctl, sigs)
}

// controlPipe returns fd 3, the pipe from remutex, ready to be read by a
// goroutine and closed under it. The command does not inherit it.
func controlPipe() (*os.File, error) {
	const fd = 3
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil, fmt.Errorf("fd %d is not the control pipe from remutex (%v)", fd, err)
	}
	syscall.CloseOnExec(fd)
	// Non-blocking, so that os.File reads it through the poller and Close
	// ends a pending Read.
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	return os.NewFile(fd, "remutex-control"), nil
}

// group is the command's process group; its id is the command's pid.
type group struct {
	pgid   int
	spec   supervisorSpec
	killed bool             // SIGKILL sent
	giveUp <-chan time.Time // the wait after SIGKILL ends
}

// supervise runs until every process of the group is gone and returns the
// command's status. Events: signals to pass on from remutex; the end of
// remutex (the pipe closes, or a signal finds it gone), which calls for
// SIGKILL at once; the command's exit, after which what it left behind gets
// SIGTERM and, after the grace, SIGKILL.
func (g *group) supervise(ctl *os.File, sigs <-chan os.Signal) int {
	fromRemutex, stopReading := readControl(ctl)
	defer stopReading()
	leader := make(chan int, 1)
	go func() { leader <- waitPid(g.pgid) }()

	status := 128 + int(syscall.SIGKILL) // if remutex is gone, nobody reads it
	var poll, graceOver <-chan time.Time
	for {
		select {
		case sig, ok := <-fromRemutex:
			switch {
			case !ok: // remutex has exited: its lease is no longer renewed
				fromRemutex = nil
				g.kill()
			case sig == syscall.SIGKILL:
				g.kill()
			default:
				g.signal(sig)
			}
		case <-sigs:
			if os.Getppid() != g.spec.parent {
				fromRemutex = nil
				g.kill()
			}
		case st := <-leader:
			// The rest of the group is reaped only from here on, so that no
			// other wait takes the leader's status.
			leader = nil
			if fromRemutex != nil {
				status = st
			}
			if g.empty() {
				return status
			}
			graceOver = g.stopLeftovers()
			t := time.NewTicker(groupPoll)
			defer t.Stop()
			poll = t.C
		case <-poll:
			if g.empty() {
				return status
			}
		case <-graceOver:
			g.kill()
		case <-g.giveUp:
			// Only a process stuck in the kernel outlives SIGKILL this long.
			// If it is the leader, its waiter stays blocked until it dies;
			// the supervisor exits without it.
			fmt.Fprintf(os.Stderr, "remutex: processes of the command (process group %d) remain %v after SIGKILL\n", g.pgid, killedTimeout)
			return status
		}
	}
}

// stopLeftovers sends SIGTERM to what the command left running in the group,
// unless it was killed already, and returns when the grace for it ends.
func (g *group) stopLeftovers() (graceOver <-chan time.Time) {
	if g.killed {
		return nil
	}
	fmt.Fprintf(os.Stderr, "remutex: the command exited, but processes it started are still running: sending them SIGTERM (SIGKILL in %v)\n", g.spec.grace)
	g.signal(syscall.SIGTERM)
	g.signal(syscall.SIGCONT) // a stopped process must be able to act on it
	return time.After(g.spec.grace)
}

// kill sends SIGKILL to the group, once, and starts the wait for it to go.
func (g *group) kill() {
	if g.killed {
		return
	}
	g.killed = true
	g.signal(syscall.SIGKILL)
	g.giveUp = time.After(killedTimeout)
}

// signal sends sig to every process of the group.
func (g *group) signal(sig syscall.Signal) { _ = syscall.Kill(-g.pgid, sig) }

// empty reaps what has exited of the group and reports whether any process
// remains in it.
func (g *group) empty() bool {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-g.pgid, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			break
		}
	}
	return errors.Is(syscall.Kill(-g.pgid, 0), syscall.ESRCH)
}

// readControl reads the signals remutex asks for from ctl, one byte each,
// and passes them on; the channel closes when the pipe does: remutex has
// exited. stop closes ctl and joins the reader.
func readControl(ctl *os.File) (signals <-chan syscall.Signal, stop func()) {
	out := make(chan syscall.Signal)
	go func() {
		defer close(out)
		buf := make([]byte, 16)
		for {
			n, err := ctl.Read(buf)
			for _, b := range buf[:n] {
				out <- syscall.Signal(b)
			}
			if err != nil {
				return
			}
		}
	}()
	return out, func() {
		_ = ctl.Close() // ends a pending Read
		for range out {
		}
	}
}

// waitPid waits for process pid to exit and returns its status as a shell
// reports it: its exit code, or 128+N if signal N killed it.
func waitPid(pid int) int {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return exitCannotRun
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}
