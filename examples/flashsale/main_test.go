package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain makes the test binary a -procs child when the parent (a test
// below) starts it as one: os.Executable is the test binary then.
func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec))
	}
	os.Exit(m.Run())
}

// TestLockedSaleIsExact runs a small sale (on REDIS_ADDR if set, else on an
// embedded miniredis) and checks that the locked run sold exactly the stock.
func TestLockedSaleIsExact(t *testing.T) {
	cfg := config{stock: 30, buyers: 60, clients: 3, goroutines: 4, gap: 200 * time.Microsecond}
	var out strings.Builder
	ok, err := run(context.Background(), io.MultiWriter(&out, testWriter{t}), cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("locked run was not exact:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "DistMutex:  sold 30, refused 30, stock left 0") {
		t.Errorf("report lacks the exact locked result:\n%s", out.String())
	}
}

// TestLockedSaleIsExactInProcesses runs the sale in three child processes
// (this test binary started again, see TestMain), each one remutex Client, on
// one Redis: REDIS_ADDR if set, else an embedded miniredis in this process.
func TestLockedSaleIsExactInProcesses(t *testing.T) {
	cfg := config{stock: 30, buyers: 60, clients: 1, goroutines: 4, gap: 200 * time.Microsecond, procs: 3}
	var out strings.Builder
	ok, err := run(context.Background(), io.MultiWriter(&out, testWriter{t}), cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("locked run was not exact:\n%s", out.String())
	}
	for _, want := range []string{"in 3 processes × 4 goroutines", "DistMutex:  sold 30, refused 30, stock left 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// testWriter sends the report to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
