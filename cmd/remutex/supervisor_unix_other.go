//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// setParentDeathSignal does nothing here: only Linux has a parent-death
// signal. The supervisor learns of remutex's death when the control pipe
// closes.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// adoptOrphans does nothing here: orphans of the command go to init, which
// reaps them; the supervisor sees the group empty once it has.
func adoptOrphans() {}

// selfPath is the remutex binary to start as the supervisor.
func selfPath() (string, error) { return os.Executable() }
