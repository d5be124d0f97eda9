//go:build unix && !linux

package main

import "syscall"

// setDeathSignal does nothing here: only Linux can kill the command when
// remutex dies.
func setDeathSignal(*syscall.SysProcAttr) {}
