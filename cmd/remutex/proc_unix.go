//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// exitStatus is the status a shell reports for the command: its exit code,
// or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// foregroundTTY returns standard input's descriptor if it is a terminal
// whose foreground process group is remutex's.
func foregroundTTY() (int, bool) {
	fd := int(os.Stdin.Fd())
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return 0, false
	}
	return fd, int(pgrp) == syscall.Getpgrp()
}

// takeTerminal makes remutex's process group the foreground group of the
// terminal fd again. Doing so from a background group raises SIGTTOU, which
// is ignored meanwhile.
func takeTerminal(fd int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	pgrp := int32(syscall.Getpgrp())
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(syscall.TIOCSPGRP), uintptr(unsafe.Pointer(&pgrp)))
}
