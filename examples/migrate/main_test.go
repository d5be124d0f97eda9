package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestMigrateOnce runs the example on an embedded miniredis, on a
// redis-server of its own, and on REDIS_ADDR if set: in round 1 one server
// runs the migration and the others serve after it; in round 2 the runner
// dies mid-way and exactly one waiter resumes it with a higher fencing
// token; no server serves early, no step is applied twice, and the report
// ends with an ok verdict.
func TestMigrateOnce(t *testing.T) {
	backends := []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(*testing.T) string { return "" }},
		{"redis-server", func(t *testing.T) string { return redistest.Start(t).Addr() }},
	}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		backends = append(backends, struct {
			name string
			addr func(t *testing.T) string
		}{"REDIS_ADDR", func(*testing.T) string { return addr }})
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			cfg := config{procs: 4, steps: 4, step: 10 * time.Millisecond, lease: 2 * time.Second} // (a lease that outlasts a starved watchdog on a busy machine)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out strings.Builder
			ok, err := run(ctx, &out, cfg, b.addr(t))
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if !ok || !strings.Contains(out.String(), "\nverdict:        ok: ") {
				t.Errorf("got a failed verdict, want ok:\n%s", out.String())
			}
		})
	}
}
