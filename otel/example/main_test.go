package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example (on REDIS_ADDR if set, else on an embedded
// miniredis): its verdict holds the scrape's acquisitions, timeouts and
// holds against what the buyers saw; the test checks the other samples.
// The buyers' patience is far longer than the whole sale takes on a quiet
// machine, so that a busy one still has acquisitions to count (how many
// give up does not matter: the verdict compares the counts).
func TestExample(t *testing.T) {
	cfg := config{items: 2, stock: 5, buyers: 12, clients: 3, patience: 5 * time.Second, think: time.Millisecond}
	var out strings.Builder
	err := run(context.Background(), &out, os.Getenv("REDIS_ADDR"), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	acquired := total(lines, "remutex_lock_acquisitions_total{")
	if acquired == 0 {
		t.Fatal("no acquisitions in the scrape")
	}
	for _, c := range []struct {
		prefix string
		labels []string
		want   int
	}{
		{"remutex_lock_acquisitions_total{", []string{`remutex_lock_name="sale"`, `remutex_lock_mode="write"`}, acquired},
		{"remutex_lock_wait_duration_seconds_count{", []string{`remutex_lock_outcome="acquired"`}, acquired},
		{"remutex_lock_hold_duration_seconds_count{", []string{`remutex_lock_end="released"`}, acquired},
		{"remutex_lock_waiting{", nil, 0},
	} {
		if got := total(lines, c.prefix, c.labels...); got != c.want {
			t.Errorf("%s %v: got %d, want %d", c.prefix, c.labels, got, c.want)
		}
	}
	if !strings.Contains(out.String(), "\nverdict:  ok:") {
		t.Error("no verdict ok")
	}
}
