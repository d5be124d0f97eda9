package partition

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// TestMain runs the suite, or, when the binary was started again as a
// holder process (see redistest.StartChild), that holder's role.
func TestMain(m *testing.M) {
	if role := redistest.ChildRole(); role != "" {
		os.Exit(runChild(role))
	}
	redistest.DefaultParallel(len(partKinds) + len(partChecks)) // its runs go at once
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}

// runChild is the test binary run as a child: it reads what it was told
// (redistest.HolderFromEnv) and plays role.
func runChild(role string) int {
	cfg := redistest.HolderFromEnv(role)
	switch role {
	case "partition":
		return partitionRole(cfg)
	case "candidate":
		return candidateRole(cfg)
	case "observer":
		return observerRole(cfg)
	}
	redistest.Emit("fatal", "unknown-role", role)
	return 2
}

// errKind names err's class in a holder's report.
func errKind(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, remutex.ErrLockLost):
		return "lost"
	case errors.Is(err, remutex.ErrNotHeld):
		return "notheld"
	case errors.Is(err, remutex.ErrClosed):
		return "closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "ctx"
	}
	return "other:" + strings.ReplaceAll(err.Error(), " ", "_")
}

// boolText names a register write's outcome in a holder's report.
func boolText(ok bool, err error) string {
	switch {
	case err != nil:
		return "error:" + strings.ReplaceAll(err.Error(), " ", "_")
	case ok:
		return "1"
	}
	return "0"
}
