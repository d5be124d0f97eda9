package redistest

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// HolderConfig is what a holder child process (the test binary run again,
// see StartChild) is told through its environment: its role, the Redis and
// the lock it works on, and the register it writes to. The fault suites and
// the root package's fault tests share it.
type HolderConfig struct {
	Role        string
	Addr        string // the Redis the holder locks on
	Name        string // the lock's name
	Lease       time.Duration
	Register    string // the address of the register's server
	RegisterKey string
	ID          string
	Goroutines  int
}

// The environment of a holder: what HolderConfig says.
const (
	holderAddrEnv     = "REMUTEX_CHILD_ADDR"
	holderNameEnv     = "REMUTEX_CHILD_NAME"
	holderLeaseEnv    = "REMUTEX_CHILD_LEASE"
	holderRegEnv      = "REMUTEX_CHILD_REGISTER"
	holderRegKeyEnv   = "REMUTEX_CHILD_REGISTER_KEY"
	holderIDEnv       = "REMUTEX_CHILD_ID"
	holderRoutinesEnv = "REMUTEX_CHILD_GOROUTINES"
)

// Env is c as the holder's environment.
func (c HolderConfig) Env() []string {
	return []string{
		holderAddrEnv + "=" + c.Addr,
		holderNameEnv + "=" + c.Name,
		holderLeaseEnv + "=" + c.Lease.String(),
		holderRegEnv + "=" + c.Register,
		holderRegKeyEnv + "=" + c.RegisterKey,
		holderIDEnv + "=" + c.ID,
		holderRoutinesEnv + "=" + strconv.Itoa(c.Goroutines),
	}
}

// HolderFromEnv is what the holder of role was told (see Env), read in the
// child.
func HolderFromEnv(role string) HolderConfig {
	c := HolderConfig{
		Role:        role,
		Addr:        os.Getenv(holderAddrEnv),
		Name:        os.Getenv(holderNameEnv),
		Register:    os.Getenv(holderRegEnv),
		RegisterKey: os.Getenv(holderRegKeyEnv),
		ID:          os.Getenv(holderIDEnv),
	}
	c.Lease, _ = time.ParseDuration(os.Getenv(holderLeaseEnv))
	c.Goroutines, _ = strconv.Atoi(os.Getenv(holderRoutinesEnv))
	return c
}

// StartHolder starts a holder child in c's role; it is killed and reaped at
// the end of the test.
func StartHolder(t testing.TB, c HolderConfig) *Child {
	t.Helper()
	return StartChild(t, c.Role, c.ID, c.Env()...)
}
