package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestOncePerTick runs the example (on REDIS_ADDR if set, else on an
// embedded miniredis whose clock follows the wall clock) and checks that
// with the minimum hold every tick ran exactly once. The plain mutex's runs
// are printed, not checked: how often the job repeats there depends on
// scheduling. The minimum hold leaves slack on either side: it outlasts the
// skew (80ms) by 100ms and ends 120ms before the next tick.
func TestOncePerTick(t *testing.T) {
	cfg := config{procs: 3, period: 300 * time.Millisecond, ticks: 3, skew: 40 * time.Millisecond,
		job: 5 * time.Millisecond, minHold: 180 * time.Millisecond, maxHold: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	sum, err := run(ctx, &out, cfg, os.Getenv("REDIS_ADDR"))
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.minHold.runs) != cfg.ticks {
		t.Fatalf("got %d ticks with the minimum hold, want %d", len(sum.minHold.runs), cfg.ticks)
	}
	for k, ran := range sum.minHold.runs {
		if len(ran) != 1 {
			t.Errorf("with the minimum hold, tick %d ran on processes %v, want exactly one", k+1, ran)
		}
	}
	if !strings.Contains(out.String(), "\nverdict:     ok: ") {
		t.Errorf("the report lacks an ok verdict:\n%s", out.String())
	}
}
