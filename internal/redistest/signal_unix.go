//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// resume sends SIGCONT, so that a paused (SIGSTOPped) process can be killed
// and reaped.
func resume(p *os.Process) { _ = p.Signal(syscall.SIGCONT) }
