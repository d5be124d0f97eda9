//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// supervisedJob is a command run through a supervisor (see supervisor_unix.go).
type supervisedJob struct {
	sup     *exec.Cmd // the supervisor
	ctl     *os.File  // the control pipe's write end: signals to pass on
	exited  chan struct{}
	restore func() // gives the terminal back
}

// startJob starts cmd (its Path, Args and Env) under a supervisor that
// answers for its whole process group. grace is how long processes the
// command leaves behind get between SIGTERM and SIGKILL.
//
// When standard input is a terminal and remutex runs in its foreground, the
// command's group becomes the terminal's foreground group, so that it can
// read the terminal as if run directly and Ctrl-C reaches it once; finish
// gives the terminal back.
func startJob(cmd *exec.Cmd, grace time.Duration) (job, error) {
	self, err := selfPath()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	spec := supervisorSpec{parent: os.Getpid(), grace: grace}
	restore := func() {}
	if fd, ok := foregroundTTY(); ok {
		spec.foreground = true
		restore = func() { takeTerminal(fd) }
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	attr := &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(attr)
	sup := &exec.Cmd{
		Path:        self,
		Args:        append([]string{"remutex-supervisor", cmd.Path}, cmd.Args...),
		Env:         append(withoutSupervisorEnv(env), supervisorEnv+"="+spec.String()),
		Stdin:       os.Stdin,
		Stdout:      os.Stdout,
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{r},
		SysProcAttr: attr,
	}
	err = sup.Start()
	_ = r.Close() // the supervisor has its copy
	if err != nil {
		_ = w.Close()
		restore()
		return nil, err
	}
	j := &supervisedJob{sup: sup, ctl: w, exited: make(chan struct{}), restore: restore}
	go func() {
		_ = sup.Wait() // the status is read from sup.ProcessState
		close(j.exited)
	}()
	return j, nil
}

func (j *supervisedJob) signal(sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		// Fails only once the supervisor has exited: nothing left to signal.
		_, _ = j.ctl.Write([]byte{byte(s)})
	}
}

func (j *supervisedJob) done() <-chan struct{} { return j.exited }

func (j *supervisedJob) finish() int {
	<-j.exited
	j.restore()
	_ = j.ctl.Close()
	return exitStatus(j.sup.ProcessState)
}
