//go:build !unix

package main

import (
	"os"
	"os/exec"
	"time"
)

// supervisorMain reports that there is no supervisor mode here.
func supervisorMain() (code int, ok bool) { return 0, false }

// directJob is a command that remutex runs itself, on systems without
// process groups: signals reach the command only, not what it started, and
// nothing stops the command if remutex dies.
type directJob struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startJob starts cmd with remutex's standard streams.
func startJob(cmd *exec.Cmd, _ time.Duration) (job, error) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	j := &directJob{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the status is read from cmd.ProcessState
		close(j.exited)
	}()
	return j, nil
}

// signal sends sig to the command, or kills it where the system cannot
// deliver sig.
func (j *directJob) signal(sig os.Signal) {
	if err := j.cmd.Process.Signal(sig); err != nil && (sig == sigTerm || sig == sigKill) {
		_ = j.cmd.Process.Kill()
	}
}

func (j *directJob) done() <-chan struct{} { return j.exited }

func (j *directJob) finish() int {
	<-j.exited
	return j.cmd.ProcessState.ExitCode()
}
