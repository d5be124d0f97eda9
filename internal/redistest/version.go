package redistest

import (
	"debug/elf"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Version is what a server binary says it is (redis-server --version).
type Version struct {
	Name                string // "Redis" or "Valkey"
	Major, Minor, Patch int
}

func (v Version) String() string {
	return fmt.Sprintf("%s %d.%d.%d", v.Name, v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v is major.minor or later, whatever its name
// (Valkey took up Redis's numbering at 7.2).
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// ClusterPort reports whether the server knows the cluster-port directive
// (Redis 7.0): without it the cluster bus listens on the client port +
// 10000.
func (v Version) ClusterPort() bool { return v.AtLeast(7, 0) }

// ShardedPubSub reports whether the server has sharded pub/sub (SPUBLISH,
// SSUBSCRIBE: Redis 7.0).
func (v Version) ShardedPubSub() bool { return v.AtLeast(7, 0) }

// versions caches BinaryVersion by binary path: the harness asks once.
var versions sync.Map // path → versionResult

type versionResult struct {
	v   Version
	err error
}

// versionLine matches "Redis server v=7.0.15 sha=..." and "Valkey server
// v=8.0.1 sha=...".
var versionLine = regexp.MustCompile(`^(\w+) server v=(\d+)\.(\d+)\.(\d+)`)

// BinaryVersion runs bin --version, once per binary, and returns what it
// says.
func BinaryVersion(bin string) (Version, error) {
	if r, ok := versions.Load(bin); ok {
		return r.(versionResult).v, r.(versionResult).err
	}
	var r versionResult
	out, err := exec.Command(bin, "--version").Output()
	m := versionLine.FindSubmatch(out)
	switch {
	case err != nil:
		r.err = fmt.Errorf("%s --version: %w", bin, err)
	case m == nil:
		r.err = fmt.Errorf("%s --version: no version in %q", bin, out)
	default:
		r.v.Name = string(m[1])
		r.v.Major, _ = strconv.Atoi(string(m[2]))
		r.v.Minor, _ = strconv.Atoi(string(m[3]))
		r.v.Patch, _ = strconv.Atoi(string(m[4]))
	}
	versions.Store(bin, r)
	return r.v, r.err
}

// ServerVersion returns the version of the redis-server on PATH, the one
// the harness starts (skipping or failing the test as Require does when
// there is none).
func ServerVersion(t testing.TB) Version {
	t.Helper()
	v, err := BinaryVersion(Require(t, "redis-server"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// linksTLS reports whether bin, an ELF executable, links OpenSSL's libssl,
// as a server built with TLS (make BUILD_TLS=yes) does. It is false where
// that cannot be told (not ELF, say): the caller asks only after a TLS
// server failed to start, to tell a build without TLS from a fault.
func linksTLS(bin string) bool {
	f, err := elf.Open(bin)
	if err != nil {
		return false
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return false
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libssl") {
			return true
		}
	}
	return false
}
