package main

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// results is everything one run measured.
type results struct {
	Machine      machine
	Plan         plan
	Started      time.Time
	Took         time.Duration
	Variants     []variantInfo
	Floor        floorResult
	Uncontended  map[string]*cycleResult
	Nested       *nestedResult
	Contended    map[string]*contendedResult
	Held         map[string]*heldResult
	RW           *rwResult
	Semaphore    *semResult                         // the contended semaphore
	Handoff      *handoffResults                    // the hand-off to an idle waiter, beside the pub/sub floor
	Hooks        map[string]*cycleResult            // the uncontended cycle with and without the OpenTelemetry adapter
	Scale        map[string]map[string]*scaleResult // by locks in use, then variant
	Instructions *instrResults                      // counted under callgrind (-instructions)
	Violations   []string
	Problems     []string // errors of a peer that are not violations
}

type variantInfo struct {
	Name, Lib, Setup string
	Remutex          bool
}

func run(p plan, vs []variant, want map[string]bool) (*results, error) {
	res := &results{
		Plan:        p,
		Started:     time.Now(),
		Uncontended: map[string]*cycleResult{},
		Contended:   map[string]*contendedResult{},
		Held:        map[string]*heldResult{},
		Scale:       map[string]map[string]*scaleResult{},
	}
	for _, v := range vs {
		res.Variants = append(res.Variants, variantInfo{v.name, v.lib, v.setup, v.remutex})
	}
	res.Machine = describeMachine()
	if want["instructions"] {
		if err := ensureValgrind(); err != nil { // before minutes of timing
			return nil, err
		}
	}
	srv, err := startServer()
	if err != nil {
		return nil, err
	}
	defer running.remove(srv)
	defer srv.stop()
	running.add(srv)
	res.Machine.Redis = srv.version()
	res.Machine.RedisAddr = srv.addr
	res.logf("redis-server %s on %s, load %s", res.Machine.Redis, srv.addr, res.Machine.LoadStart)

	res.checkExclusions(vs, srv)
	if want["uncontended"] {
		if err := res.runUncontended(vs, srv); err != nil {
			return nil, err
		}
	}
	if want["nested"] {
		res.runNested(vs, srv)
	}
	if res.Floor.RTT == 0 { // no uncontended rounds: measure the floor alone
		if err := floorRound(srv.addr, time.Second, &res.Floor); err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		res.Floor.finish()
	}
	res.runLoads(vs, srv, want)
	res.noteStalls(vs, "")
	if want["instructions"] {
		if err := res.runInstructions(vs); err != nil { // the timing figures are still worth writing
			res.Problems = append(res.Problems, "instructions: "+err.Error())
			fmt.Fprintln(os.Stderr, "instructions:", err)
		}
		res.noteStalls(vs, " under callgrind")
	}
	res.Machine.LoadEnd = loadavg()
	res.Took = time.Since(res.Started)
	return res, nil
}

// checkExclusions checks that every variant excludes at all (see
// checkExclusion).
func (r *results) checkExclusions(vs []variant, srv *server) {
	for _, v := range vs {
		switch err := checkExclusion(v, srv.addr); {
		case errors.Is(err, errTwoHolders):
			r.Violations = append(r.Violations, fmt.Sprintf("%s: exclusion check: %v", v.name, err))
		case err != nil:
			r.problem(v, "exclusion check", err)
		}
	}
}

// runLoads runs the scenarios after the uncontended ones, in order.
func (r *results) runLoads(vs []variant, srv *server, want map[string]bool) {
	for _, s := range []struct {
		name string
		run  func()
	}{
		{"contended", func() { r.runContended(vs, srv) }},
		{"held", func() { r.runHeld(vs, srv) }},
		{"rw", func() { r.runRW(srv) }},
		{"semaphore", func() { r.runSemaphore(srv) }},
		{"hooks", func() { r.runHooks(srv) }},
		{"scale", func() { r.runScale(vs, srv) }},
		{"handoff", func() { r.runHandoff(vs, srv) }},
	} {
		if want[s.name] {
			s.run()
		}
	}
}

// logf reports progress on stderr, with the time since the run started.
func (r *results) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[%6.1fs] "+format+"\n", append([]any{time.Since(r.Started).Seconds()}, args...)...)
}

// inTurn returns the variants in the order of round: each round begins one
// further along the list. Where a variant stands in a round changes what it
// runs after (a slower first round after the floor, a Client just closed),
// and that alone moved one figure by up to a third: so every variant takes
// every place in turn, and none always follows the same one.
func inTurn[V any](vs []V, round int) []V {
	if len(vs) == 0 {
		return nil
	}
	k := round % len(vs)
	return append(append(make([]V, 0, len(vs)), vs[k:]...), vs[:k]...)
}

func (r *results) runUncontended(vs []variant, srv *server) error {
	for _, v := range vs {
		r.Uncontended[v.name] = &cycleResult{}
	}
	// Rounds go through every variant in turn (see inTurn), and through the
	// floor, so that a change in the machine's load touches all of them
	// alike.
	for round := 0; round < r.Plan.Rounds; round++ {
		if err := floorRound(srv.addr, r.Plan.RoundTime, &r.Floor); err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		for _, v := range inTurn(vs, round) {
			if err := uncontendedRound(v, srv, span{d: r.Plan.RoundTime}, r.Uncontended[v.name]); err != nil {
				r.problem(v, "uncontended", err)
			}
		}
	}
	r.Floor.finish()
	r.logf("floor: PING %v (go-redis), %v (bare socket)", r.Floor.RTT, r.Floor.Raw)
	for _, v := range vs {
		c := r.Uncontended[v.name]
		c.finish()
		r.logf("uncontended %-17s %8.1fµs/cycle %5.1f allocs", v.name, us(c.Cycle), c.Allocs)
	}
	return nil
}

func (r *results) runNested(vs []variant, srv *server) {
	for _, v := range vs {
		if !v.remutex {
			continue
		}
		n, err := nested(v, srv, r.Plan.Nested)
		if err != nil {
			r.problem(v, "nested", err)
			continue
		}
		r.Nested = &n
		r.logf("nested %s: lock %v unlock %v, PING %v", v.name, n.Lock, n.Unlock, n.Ping)
	}
}

// runContended measures the contended hand-off in rounds, the variants
// interleaved, so that the machine growing slower or faster during the run
// does not favour the variant measured while it was quiet (see mergeRounds).
func (r *results) runContended(vs []variant, srv *server) {
	rounds := max(1, r.Plan.ContendedRounds)
	window := r.Plan.ContendedTime / time.Duration(rounds)
	byName := map[string][]contendedResult{}
	for round := range rounds {
		for _, v := range inTurn(vs, round) {
			c, err := contended(v, srv, span{d: window})
			if err != nil {
				r.problem(v, "contended", err)
				continue
			}
			byName[v.name] = append(byName[v.name], c)
		}
	}
	for _, v := range vs {
		if len(byName[v.name]) == 0 {
			continue
		}
		c := mergeRounds(byName[v.name])
		r.Contended[v.name] = &c
		if c.Overlaps > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: contended: %d acquisitions overlapped another holder", v.name, c.Overlaps))
		}
		if c.Errors > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: contended: %d errors, first: %s", v.name, c.Errors, c.FirstErr))
		}
		r.logf("contended %-17s %6.0f acq/s util %5.1f%% %v p99 %v max %v", v.name, c.PerSecond, 100*c.Utilisation,
			c.Rounds, c.WaitP99.Round(time.Microsecond), c.WaitMax.Round(time.Microsecond))
	}
}

func (r *results) runHeld(vs []variant, srv *server) {
	for _, v := range vs {
		if !v.held {
			continue
		}
		h, err := manyHeld(v, srv, r.Plan.HeldLocks, r.Plan.HeldLease, r.Plan.TakeLimit)
		if err != nil {
			r.problem(v, "held", err)
			continue
		}
		r.Held[v.name] = &h
		if v.remutex && h.Lost > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: held: %d of %d holds lost while held", v.name, h.Lost, h.Locks))
		}
		r.logf("held %-17s %d round trips, %d commands, +%d goroutines, %d lost", v.name, h.Bursts, h.Commands, h.Goroutines, h.Lost)
	}
}

// noteStalls reports the Lock calls of rueidislock that the harness retried
// (where: "" or " under callgrind"), and counts them anew.
func (r *results) noteStalls(vs []variant, where string) {
	for _, v := range vs {
		if v.stalls != nil && v.stalls.Load() > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%s: %d Lock calls%s waited more than %v without getting a free lock and were retried "+
				"(an attempt that times out on a free key waits for an invalidation that never comes)", v.name, v.stalls.Swap(0), where, rueidisStall))
		}
	}
}

// problem records a scenario a variant could not complete. For remutex that
// is a violation; for a peer it is reported.
func (r *results) problem(v variant, scenario string, err error) {
	msg := fmt.Sprintf("%s: %s: %v", v.name, scenario, err)
	if v.remutex {
		r.Violations = append(r.Violations, msg)
	} else {
		r.Problems = append(r.Problems, msg)
	}
	fmt.Fprintln(os.Stderr, msg)
}
