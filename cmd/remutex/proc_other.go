//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// prepare does nothing on systems without process groups.
func prepare(*exec.Cmd) (restore func()) { return func() {} }

// signalCommand sends sig to the command, or kills it where the system cannot
// deliver sig.
func signalCommand(cmd *exec.Cmd, sig os.Signal) {
	if err := cmd.Process.Signal(sig); err != nil && (sig == sigTerm || sig == sigKill) {
		_ = cmd.Process.Kill()
	}
}

// exitStatus is the command's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
