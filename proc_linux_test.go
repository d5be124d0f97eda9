package remutex

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes cmd's process receive SIGKILL when the test binary
// dies, so that a killed or timed-out test run leaves no server behind.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
