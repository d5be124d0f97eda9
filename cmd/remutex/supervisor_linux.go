package main

import "syscall"

// setDeathSignal has the kernel kill the command if remutex dies: the lock
// then ends within its lease, and the command must not outlive it. The kernel
// sends the signal when the thread that started the command exits, so the
// goroutine that starts it stays locked to its thread.
func setDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}
