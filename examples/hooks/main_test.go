package main

import (
	"context"
	"expvar"
	"os"
	"strings"
	"testing"
)

// TestHooks runs the example (on REDIS_ADDR if set, else on an embedded
// miniredis) and checks the counters and log lines the hook produced.
func TestHooks(t *testing.T) {
	m := newMetrics()
	var out strings.Builder
	err := run(context.Background(), &out, os.Getenv("REDIS_ADDR"), m)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	count := func(name string) int64 {
		v, _ := m.vars.Get(name).(*expvar.Int)
		if v == nil {
			return 0
		}
		return v.Value()
	}
	for _, c := range []struct {
		name string
		want int64 // -1: at least one
	}{
		{"acquired", 4}, {"released", 3}, {"waited", 2}, {"waited_gave_up", 1}, {"lost", 1}, {"renewed", -1},
	} {
		got := count(c.name)
		if (c.want < 0 && got < 1) || (c.want >= 0 && got != c.want) {
			t.Errorf("counter %s = %d, want %d (-1: at least 1)", c.name, got, c.want)
		}
	}
	for _, f := range []string{"acquire_seconds", "wait_seconds", "held_seconds", "renew_seconds"} {
		if v, _ := m.vars.Get(f).(*expvar.Float); v == nil || v.Value() <= 0 {
			t.Errorf("duration total %s missing or zero", f)
		}
	}
	for _, line := range []string{
		`level=INFO msg="remutex acquired"`, `level=INFO msg="remutex renewed"`, `level=INFO msg="remutex waited"`,
		`level=INFO msg="remutex released"`, `level=WARN msg="remutex waited"`, `level=WARN msg="remutex lost"`,
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("no log line %s", line)
		}
	}
}
