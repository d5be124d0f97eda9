//go:build unix

package main

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"unsafe"
)

// prepare makes cmd run in a process group of its own, so that the signals
// remutex passes on, and those that stop it after a lost lease, reach
// everything it started, and a terminal's Ctrl-C reaches it once, not twice.
// When standard input is a terminal and remutex runs in its foreground, the
// command's group becomes the terminal's foreground group, so that it can
// read the terminal as if run directly; restore gives the terminal back once
// the command has exited.
func prepare(cmd *exec.Cmd) (restore func()) {
	attr := &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(attr)
	restore = func() {}
	if fd, ok := foregroundTTY(); ok {
		attr.Foreground, attr.Ctty = true, fd
		restore = func() { takeTerminal(fd) }
	}
	cmd.SysProcAttr = attr
	return restore
}

// signalCommand sends sig to the command's process group.
func signalCommand(cmd *exec.Cmd, sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(-cmd.Process.Pid, s)
		return
	}
	_ = cmd.Process.Signal(sig)
}

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
