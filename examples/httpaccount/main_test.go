package main

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestTransfers runs the example (on REDIS_ADDR if set, else on an embedded
// miniredis): with the locks every balance is what the accepted transfers
// make it, and a request that cannot get its lock in time gets 503 and
// leaves nothing behind.
func TestTransfers(t *testing.T) {
	cfg := config{accounts: 4, opening: 1000, transfers: 120, clients: 8, gap: 500 * time.Microsecond}
	var out strings.Builder
	res, err := run(context.Background(), &out, cfg, os.Getenv("REDIS_ADDR"))
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	l := res.locked
	if got := l.status[http.StatusOK] + l.status[http.StatusConflict]; got != cfg.transfers {
		t.Errorf("%d of %d transfers answered 200 or 409 with the locks (statuses %v)", got, cfg.transfers, l.status)
	}
	if l.status[http.StatusOK] == 0 {
		t.Error("no transfer went through")
	}
	if l.total != l.opening {
		t.Errorf("with the locks the balances add up to %d, want %d", l.total, l.opening)
	}
	for a, want := range l.expected {
		if got := l.balances[a]; got != want || got < 0 {
			t.Errorf("with the locks %s has %d, want %d from the accepted transfers", a, got, want)
		}
	}
	b := res.busy
	if b.status != http.StatusServiceUnavailable || !strings.Contains(b.body, "context deadline exceeded") {
		t.Errorf("busy account: got %d %q, want 503 for the deadline", b.status, b.body)
	}
	if len(b.leftovers) > 0 {
		t.Errorf("the request that gave up left behind: %v", b.leftovers)
	}
}
