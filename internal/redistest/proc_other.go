//go:build !linux

package redistest

import "os/exec"

// DieWithParent does nothing where the kernel offers no parent-death signal.
func DieWithParent(*exec.Cmd) {}
