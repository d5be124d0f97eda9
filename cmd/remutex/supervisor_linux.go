package main

import "syscall"

// prSetChildSubreaper is prctl's PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

// setParentDeathSignal has the kernel send the supervisor SIGTERM when
// remutex dies. Between fork and exec, Go sets it with prctl and then checks
// getppid: if remutex died before prctl, the child signals itself, so there
// is no window in which remutex's death goes unnoticed. The signal comes when
// the thread that started the supervisor exits, which is why that goroutine
// stays locked to its thread; the supervisor checks getppid on every signal,
// so a stray one does no harm, and the closing control pipe tells it too.
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGTERM
}

// adoptOrphans makes the supervisor a child subreaper: processes of the
// command whose parent exits become its children rather than init's, so that
// it can reap them and see when the command's group is empty.
func adoptOrphans() {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}

// selfPath is the remutex binary to start as the supervisor. /proc/self/exe
// works even if the file was replaced or removed since remutex started.
func selfPath() (string, error) { return "/proc/self/exe", nil }
