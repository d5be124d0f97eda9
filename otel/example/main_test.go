package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestExample runs the example (on REDIS_ADDR if set, else on an embedded
// miniredis) and checks the scrape against what the sale reported.
func TestExample(t *testing.T) {
	cfg := config{items: 2, stock: 5, buyers: 12, clients: 3, patience: 20 * time.Millisecond, think: time.Millisecond}
	var out strings.Builder
	err := run(context.Background(), &out, os.Getenv("REDIS_ADDR"), cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	var sold, total, locked, gaveUp int
	if _, err := fmt.Sscanf(out.String(), "sold %d of %d items; buyers held a lock %d times and gave up waiting %d times",
		&sold, &total, &locked, &gaveUp); err != nil {
		t.Fatalf("first line: %v", err)
	}
	if sold > total || locked+gaveUp != cfg.buyers*cfg.items {
		t.Errorf("sold %d of %d, locked %d + gave up %d, want %d attempts", sold, total, locked, gaveUp, cfg.buyers*cfg.items)
	}
	for _, c := range []struct {
		sample string
		want   int
	}{
		{`remutex_lock_acquisitions_total{remutex_lock_handoff="free",remutex_lock_mode="write",remutex_lock_name="sale"}`, -1},
		{`remutex_lock_wait_duration_seconds_count{remutex_lock_mode="write",remutex_lock_name="sale",remutex_lock_outcome="acquired"}`, locked},
		{`remutex_lock_hold_duration_seconds_count{remutex_lock_end="released",remutex_lock_mode="write",remutex_lock_name="sale"}`, locked},
		{`remutex_lock_held{remutex_lock_mode="write",remutex_lock_name="sale"}`, 0},
		{`remutex_lock_waiting{remutex_lock_mode="write",remutex_lock_name="sale"}`, 0},
	} {
		got, ok := sample(out.String(), c.sample)
		switch {
		case !ok:
			t.Errorf("no sample %s in the scrape", c.sample)
		case c.want >= 0 && got != c.want:
			t.Errorf("%s: got %d, want %d", c.sample, got, c.want)
		}
	}
	if gaveUp > 0 {
		got, _ := sample(out.String(), `remutex_lock_wait_duration_seconds_count{remutex_lock_mode="write",remutex_lock_name="sale",remutex_lock_outcome="timeout"}`)
		if got != gaveUp {
			t.Errorf("timeouts in the scrape: got %d, want %d", got, gaveUp)
		}
	}
}

// sample returns the value of a sample in a scrape.
func sample(scrape, name string) (int, bool) {
	for _, line := range strings.Split(scrape, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err == nil
		}
	}
	return 0, false
}
