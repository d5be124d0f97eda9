package main

import (
	"context"
	"errors"
	"expvar"
	"os"
	"strings"
	"testing"

	"github.com/remutex/remutex"
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

// TestHooksOneHolderAtATime checks that the log never shows a second holder
// before the first one's release or loss.
func TestHooksOneHolderAtATime(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), &out, os.Getenv("REDIS_ADDR"), newMetrics()); err != nil {
		t.Fatal(err)
	}
	holder := ""
	for _, line := range strings.Split(out.String(), "\n") {
		owner := field(line, "owner")
		switch {
		case strings.Contains(line, `msg="remutex acquired"`):
			if holder != "" {
				t.Errorf("%s acquired while %s held the lock:\n%s", owner, holder, out.String())
			}
			holder = owner
		case strings.Contains(line, `msg="remutex released"`), strings.Contains(line, `msg="remutex lost"`):
			if owner != holder {
				t.Errorf("%s released a lock held by %q:\n%s", owner, holder, out.String())
			}
			holder = ""
		}
	}
}

// field returns the value of key=value in a log line.
func field(line, key string) string {
	_, v, ok := strings.Cut(line, " "+key+"=")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, " ")
	return v
}

// TestHoldOrder feeds holdOrder the events of a hand-off in the order the
// hook may see them, the next holder's first, and checks the order it passes
// them on in.
func TestHoldOrder(t *testing.T) {
	ev := func(kind remutex.EventKind, owner string, err error) remutex.Event {
		return remutex.Event{Kind: kind, Lock: "l", Owner: owner, Err: err}
	}
	gaveUp := errors.New("deadline")
	in := []remutex.Event{
		ev(remutex.EventAcquired, "a", nil),
		ev(remutex.EventAcquired, "b", nil), // b's hook ran before a's Unlock returned
		ev(remutex.EventWaited, "b", nil),
		ev(remutex.EventWaited, "c", gaveUp), // c never held it: passed on at once
		ev(remutex.EventAcquired, "d", nil),  // d's came before b's release too
		ev(remutex.EventReleased, "b", nil),
		ev(remutex.EventRenewed, "a", nil),
		ev(remutex.EventReleased, "a", nil),
		ev(remutex.EventLost, "d", nil),
	}
	want := []string{"acquired a", "waited c", "renewed a", "released a", "acquired b", "waited b", "released b", "acquired d", "lost d"}
	var got []string
	o := newHoldOrder(func(e remutex.Event) { got = append(got, e.Kind.String()+" "+e.Owner) })
	for _, e := range in {
		o.pass(e)
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("got  %s\nwant %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}
