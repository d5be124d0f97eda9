package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// TestWithinTheLimit runs the example on an embedded miniredis, on a
// redis-server of its own, and on REDIS_ADDR if set: with the semaphore the
// API never sees more than the limit at once and refuses no call, every
// call is made once, and the report ends with an ok verdict. Without the
// semaphore the run is printed, not checked: how far it goes over the limit
// depends on scheduling.
func TestWithinTheLimit(t *testing.T) {
	backends := []backend{
		{"miniredis", func(*testing.T) string { return "" }},
		{"redis-server", func(t *testing.T) string { return redistest.Start(t).Addr() }},
	}
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		backends = append(backends, backend{"REDIS_ADDR", func(*testing.T) string { return addr }})
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			cfg := config{procs: 3, workers: 4, calls: 60, limit: 2, latency: 2 * time.Millisecond}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out strings.Builder
			limited, err := run(ctx, &out, cfg, b.addr(t))
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if limited.peak > int64(cfg.limit) || limited.refused != 0 {
				t.Errorf("with the semaphore the API saw %d calls at once and refused %d, want at most %d and none",
					limited.peak, limited.refused, cfg.limit)
			}
			made := 0
			for _, n := range limited.perProc {
				made += n
			}
			if limited.served != cfg.calls || made != cfg.calls {
				t.Errorf("with the semaphore %d calls were served (%d by the processes' count), want %d", limited.served, made, cfg.calls)
			}
			if !strings.Contains(out.String(), "\nverdict:        ok: ") {
				t.Errorf("the report lacks an ok verdict:\n%s", out.String())
			}
		})
	}
}

// backend is a Redis the example runs on: addr returns its address, ""
// for an embedded miniredis.
type backend struct {
	name string
	addr func(t *testing.T) string
}

// TestVerdict checks the last line, on which the exit status depends: a run
// with the semaphore that went over the limit, or had a call refused or
// missing, is a FAIL.
func TestVerdict(t *testing.T) {
	cfg := config{calls: 10, limit: 2}
	over := outcome{served: 10, refused: 3, peak: 5}
	for _, tc := range []struct {
		name    string
		limited outcome
		want    string
	}{
		{"within", outcome{served: 10, peak: 2}, "ok: with DistSemaphore(2) the API never saw more than 2 calls at once and refused none; without it up to 5, 3 refused"},
		{"over the limit", outcome{served: 10, peak: 3}, "FAIL: "},
		{"refused", outcome{served: 10, refused: 1, peak: 2}, "FAIL: "},
		{"calls missing", outcome{served: 9, peak: 2}, "FAIL: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdict(cfg, over, tc.limited)
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("got %q, want it to start with %q", got, tc.want)
			}
			if ok := tc.limited.ok(cfg); ok != strings.HasPrefix(got, "ok: ") {
				t.Errorf("ok() is %v for the verdict %q", ok, got)
			}
		})
	}
	if got := verdict(cfg, outcome{served: 10, peak: 2}, outcome{served: 10, peak: 2}); !strings.HasPrefix(got, "ok: with the semaphore the API refused no call") {
		t.Errorf("a run that stayed within the limit without the semaphore too: got %q", got)
	}
}
