package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

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

// testWriter sends the report to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
