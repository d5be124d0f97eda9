package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestFailover runs the scheduler (on REDIS_ADDR if set, else on an embedded
// miniredis) and checks that no tick ran twice, that another replica took
// over after the leader died, and that it ran the ticks after that.
func TestFailover(t *testing.T) {
	// A lease of 1s leaves room for a loaded machine: a leader must not lose
	// its lease merely because its watchdog was not scheduled in time.
	cfg := config{replicas: 3, interval: 50 * time.Millisecond, ticks: 50, failAt: 3, lease: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	sum, err := run(ctx, &out, cfg, os.Getenv("REDIS_ADDR"))
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.duplicates) > 0 {
		t.Errorf("ticks %v ran more than once", sum.duplicates)
	}
	if sum.firstLead == 0 || sum.nextLead == 0 || sum.nextLead == sum.firstLead {
		t.Fatalf("first leader replica-%d, next replica-%d: want a failover to another replica", sum.firstLead, sum.nextLead)
	}
	// The ticks run by the first leader, then (after a gap) by the next.
	after := 0
	for tick := 1; tick <= cfg.ticks; tick++ {
		who, ran := sum.ranBy[tick]
		switch {
		case !ran:
		case after == 0 && who == sum.firstLead:
		case who == sum.nextLead:
			after++
		default:
			t.Errorf("tick %d ran by replica-%d, want the first leader replica-%d and then replica-%d", tick, who, sum.firstLead, sum.nextLead)
		}
	}
	if after == 0 {
		t.Error("no tick ran after the failover")
	}
	if !sum.ok() || !strings.Contains(out.String(), "verdict:   ok") {
		t.Errorf("the run reports a failure:\n%s", out.String())
	}
}
