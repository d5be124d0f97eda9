package partition

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// TestMain runs the suite, or, when the binary was started again as a
// holder process (see redistest.StartChild), that holder's role.
func TestMain(m *testing.M) {
	if role := redistest.ChildRole(); role != "" {
		os.Exit(runChild(role))
	}
	code := m.Run()
	redistest.StopShared()
	os.Exit(code)
}

// The environment of a child: what childConfig says.
const (
	childAddrEnv     = "REMUTEX_CHILD_ADDR"
	childNameEnv     = "REMUTEX_CHILD_NAME"
	childLeaseEnv    = "REMUTEX_CHILD_LEASE"
	childRegEnv      = "REMUTEX_CHILD_REGISTER"
	childRegKeyEnv   = "REMUTEX_CHILD_REGISTER_KEY"
	childIDEnv       = "REMUTEX_CHILD_ID"
	childRoutinesEnv = "REMUTEX_CHILD_GOROUTINES"
)

// childConfig is what a holder process is told: its role, the Redis and
// lock it works on, and the register it writes to.
type childConfig struct {
	role        string
	addr        string
	name        string
	lease       time.Duration
	register    string // address of the register's server
	registerKey string
	id          string
	goroutines  int
}

func (c childConfig) env() []string {
	return []string{
		childAddrEnv + "=" + c.addr,
		childNameEnv + "=" + c.name,
		childLeaseEnv + "=" + c.lease.String(),
		childRegEnv + "=" + c.register,
		childRegKeyEnv + "=" + c.registerKey,
		childIDEnv + "=" + c.id,
		childRoutinesEnv + "=" + strconv.Itoa(c.goroutines),
	}
}

// runChild is the test binary run as a child: it reads its childConfig
// and plays role.
func runChild(role string) int {
	cfg := childConfig{
		role:        role,
		addr:        os.Getenv(childAddrEnv),
		name:        os.Getenv(childNameEnv),
		register:    os.Getenv(childRegEnv),
		registerKey: os.Getenv(childRegKeyEnv),
		id:          os.Getenv(childIDEnv),
	}
	cfg.lease, _ = time.ParseDuration(os.Getenv(childLeaseEnv))
	cfg.goroutines, _ = strconv.Atoi(os.Getenv(childRoutinesEnv))
	if role == "partition" {
		return partitionRole(cfg)
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
