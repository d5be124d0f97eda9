package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestConfig runs both passes (on REDIS_ADDR if set, else on an embedded
// miniredis): no reader may see a torn configuration under the lock, readers
// must have shared it, and the writer must have written every version.
func TestConfig(t *testing.T) {
	cfg := config{clients: 3, readers: 4, writes: 10, gap: time.Millisecond, every: 2 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	locked, err := run(ctx, &out, cfg, os.Getenv("REDIS_ADDR"))
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !locked.ok() || !strings.Contains(out.String(), "verdict:    ok") {
		t.Fatalf("the locked pass failed:\n%s", out.String())
	}
	if locked.torn != 0 || len(locked.writerWaits) != cfg.writes {
		t.Errorf("locked pass: %d torn reads, %d writes; want 0 and %d", locked.torn, len(locked.writerWaits), cfg.writes)
	}
	if locked.maxInside < 2 {
		t.Errorf("at most %d reader inside at once: readers must share the lock", locked.maxInside)
	}
}
