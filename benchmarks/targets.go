package main

import (
	"fmt"
	"math"
)

// target is one of remutex's targets, measured side by side with the peers
// in the same run.
type target struct {
	What    string
	Goal    string // "reported" where the figure has no goal
	Remutex string // remutex's figure
	Peer    string // the peer compared with, and its figure
	Ratio   string // remutex's figure over the peer's
	Known   bool   // the goal could be checked: a goal, and remutex's figure (and the peer's, for a ratio)
	Met     bool

	mine, ratio    float64 // ratio: NaN without a peer figure to divide by
	mineOK, peerOK bool
}

// Better figures are lower or higher.
const (
	lower  = true
	higher = false
)

// targets are remutex's targets: first the costs counted in instructions,
// which do not move with the machine's load; then the rest. Time and Redis
// CPU are reported beside the peers' without a goal: on a shared machine they
// move by 10 to 60% from run to run, more than the differences they would
// judge.
func (r *results) targets() []target {
	ts := r.instrTargets()
	cycle, cont := r.cycleMetric, r.contendedMetric
	ts = append(ts,
		r.against("uncontended Lock+Unlock cycle: time", "", lower, cycle(func(c *cycleResult) float64 { return us(c.Cycle) }), unit("%.1f", "µs")).
			goal("reported", nil),
		r.against("allocations per cycle", "", lower, cycle(func(c *cycleResult) float64 { return c.Allocs }), unit("%.1f", "allocs")).
			goal("≤ 17", atMost(17)),
		r.against("Redis CPU per uncontended cycle (machine-dependent)", "", lower, cycle(func(c *cycleResult) float64 { return us(c.CPU) }), unit("%.1f", "µs")).
			goal("reported", nil),
		r.againstShown(fmt.Sprintf("contended (hold %v, pause %v): acquisitions per second, and the hand-off gap", contCritical, contPause), "", higher,
			cont(func(c *contendedResult) float64 { return c.PerSecond }), r.withGap).
			goal("reported", nil),
		r.againstShown("contended: lock utilisation, and the mean hold", "", higher, cont(func(c *contendedResult) float64 { return 100 * c.Utilisation }), r.withHold).
			goal("reported", nil),
		r.against("contended: Redis CPU per acquisition (machine-dependent)", "", lower, cont(func(c *contendedResult) float64 { return us(c.CPU) }), unit("%.1f", "µs")).
			goal("reported", nil),
		r.against("contended: Redis commands executed per acquisition (INFO commandstats)", "", lower,
			cont(func(c *contendedResult) float64 { return c.Executed }), unit("%.1f", "commands")).
			goal("reported", nil),
		r.against("contended: wait p99", "", lower, cont(func(c *contendedResult) float64 { return ms(c.WaitP99) }), unit("%.2f", "ms")).
			goal("≤ 20 ms", atMost(20)),
		r.against("contended: wait max", "", lower, cont(func(c *contendedResult) float64 { return ms(c.WaitMax) }), unit("%.2f", "ms")).
			goal("≤ 50 ms", atMost(50)),
		r.against("contended: per-worker spread (most ÷ fewest acquisitions)", "", lower, cont(spreadOf), spread).
			goal("about equal: ≤ 1.2", atMost(1.2)),
		r.against("contended: overlapping holders", "", lower, cont(func(c *contendedResult) float64 { return float64(c.Overlaps) }), unit("%.0f", "")).
			goal("0", atMost(0)),
		r.against("contended: errors", "", lower, cont(func(c *contendedResult) float64 { return float64(c.Errors) }), unit("%.0f", "")).
			goal("0", atMost(0)),
	)
	if t, ok := r.heldTarget(); ok {
		ts = append(ts, t)
	}
	ts = append(ts, r.rwTargets()...)
	ts = append(ts, r.semTargets()...)
	ts = append(ts, r.handoffTargets()...)
	return append(ts, r.scaleTargets()...)
}

// withGap shows a variant's contended acquisitions per second with its mean
// hand-off gap in round trips; withHold its utilisation with its mean hold.
func (r *results) withGap(name string, x float64) string {
	c, ok := r.contendedOf(name)
	if !ok || r.Floor.RTT == 0 {
		return fmt.Sprintf("%.0f acq/s", x)
	}
	return fmt.Sprintf("%.0f acq/s, gap %.1f round trips", x, float64(c.GapMean)/float64(r.Floor.RTT))
}

func (r *results) withHold(name string, x float64) string {
	c, ok := r.contendedOf(name)
	if !ok {
		return fmt.Sprintf("%.1f %%", x)
	}
	return fmt.Sprintf("%.1f %%, hold %.0f µs", x, us(c.HoldMean))
}

// against puts remutex's figure f next to the peer's: the named peer, or the
// one with the best figure, lower or higher being better.
func (r *results) against(what, peer string, better bool, f metric, show func(float64) string) target {
	return r.againstShown(what, peer, better, f, func(_ string, x float64) string { return show(x) })
}

// againstShown is against for a figure shown with more of its variant's
// results.
func (r *results) againstShown(what, peer string, better bool, f metric, show func(name string, x float64) string) target {
	t := target{What: what, ratio: math.NaN()}
	t.mine, t.mineOK = f(r.remutexName())
	if t.mineOK {
		t.Remutex = show(r.remutexName(), t.mine)
	}
	pv, ok := 0.0, false
	if peer != "" {
		pv, ok = f(peer)
	} else {
		peer, pv, ok = r.best(f, better)
	}
	if !ok {
		return t
	}
	t.peerOK = true
	t.Peer = show(peer, pv) + " (" + peer + ")"
	if t.mineOK && pv != 0 && !math.IsInf(pv, 0) {
		t.ratio = t.mine / pv
		t.Ratio = fmt.Sprintf("%.2f×", t.ratio)
	}
	return t
}

// goal sets the goal and checks it with met; a nil met only reports.
func (t target) goal(goal string, met func(target) (bool, bool)) target {
	t.Goal = goal
	if met != nil {
		t.Met, t.Known = met(t)
	}
	return t
}

// atMost checks remutex's figure against a bound.
func atMost(limit float64) func(target) (met, known bool) {
	return func(t target) (bool, bool) { return t.mine <= limit, t.mineOK }
}

// ratioAtMost and ratioAtLeast check remutex's figure over the peer's.
func ratioAtMost(limit float64) func(target) (met, known bool) {
	return func(t target) (bool, bool) { return t.ratio <= limit, !math.IsNaN(t.ratio) }
}

func ratioAtLeast(limit float64) func(target) (met, known bool) {
	return func(t target) (bool, bool) { return t.ratio >= limit, !math.IsNaN(t.ratio) }
}

// unit shows a figure in format, followed by its unit.
func unit(format, unit string) func(float64) string {
	return func(x float64) string {
		if unit == "" {
			return fmt.Sprintf(format, x)
		}
		return fmt.Sprintf(format+" %s", x, unit)
	}
}

// spreadOf is the per-worker spread as a figure: +Inf where a worker never
// acquired.
func spreadOf(c *contendedResult) float64 {
	if c.Spread < 0 {
		return math.Inf(1)
	}
	return c.Spread
}

// heldTarget is the many-held-locks target: one goroutine renews every hold in
// batched round trips.
func (r *results) heldTarget() (target, bool) {
	h, ok := r.Held[r.remutexName()]
	if !ok {
		return target{}, false
	}
	rtt := h.perPeriod()
	return target{What: fmt.Sprintf("%d held locks renewed", h.Locks), Goal: "by one goroutine, in batched round trips (≤ 2 per lease/3)",
		Remutex: fmt.Sprintf("%.1f round trips per renewal period (lease/3), +%d goroutines, %d lost", rtt, h.Goroutines, h.Lost),
		Known:   true, Met: rtt <= 2 && h.Goroutines <= 2 && h.Lost == 0 && h.Taken == h.Locks}, true
}

// metric is one figure of a variant, false where it was not measured.
type metric func(name string) (float64, bool)

// best returns the peer (not remutex) with the best finite figure f, lower or
// higher being better.
func (r *results) best(f metric, better bool) (string, float64, bool) {
	name, val, found := "", 0.0, false
	for _, v := range r.Variants {
		if v.Remutex {
			continue
		}
		x, ok := f(v.Name)
		if !ok || math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		if !found || (better == lower && x < val) || (better == higher && x > val) {
			name, val, found = v.Name, x, true
		}
	}
	return name, val, found
}

// remutexName returns the name of the variant under test, or "".
func (r *results) remutexName() string {
	for _, v := range r.Variants {
		if v.Remutex {
			return v.Name
		}
	}
	return ""
}

func (r *results) cycleOf(name string) (*cycleResult, bool) {
	c, ok := r.Uncontended[name]
	return c, ok && c.Cycles > 0
}

func (r *results) contendedOf(name string) (*contendedResult, bool) {
	c, ok := r.Contended[name]
	return c, ok && c.Acquisitions > 0
}

// cycleMetric returns the figure sel picks from each variant's uncontended
// cycle.
func (r *results) cycleMetric(sel func(*cycleResult) float64) metric {
	return metricOf(r.cycleOf, sel)
}

// contendedMetric returns the figure sel picks from each variant's contended
// hand-off.
func (r *results) contendedMetric(sel func(*contendedResult) float64) metric {
	return metricOf(r.contendedOf, sel)
}

// metricOf returns the figure sel picks from each variant's result of a
// scenario, as of finds it.
func metricOf[T any](of func(name string) (*T, bool), sel func(*T) float64) metric {
	return func(n string) (float64, bool) {
		res, ok := of(n)
		if !ok {
			return 0, false
		}
		return sel(res), true
	}
}

// perPeriod is the round trips of the held scenario per renewal period
// (lease/3).
func (h *heldResult) perPeriod() float64 {
	return float64(h.Bursts) / (float64(h.Held) / float64(h.Lease/3))
}

// scaleTargets are the targets of many locks in use at once, at scaleTarget
// locks: throughput and Redis CPU per cycle against the best peer's, and how
// the cost grows with the number of locks.
func (r *results) scaleTargets() []target {
	if len(r.Scale) == 0 {
		return nil
	}
	at := func(sel func(*scaleResult) float64) metric { return r.scaleMetric(scaleTarget, sel) }
	what := fmt.Sprintf("scale, %d locks (4 clients × 16 goroutines): ", scaleTarget)
	ts := []target{
		r.against(what+"cycles/s", "", higher, at(func(c *scaleResult) float64 { return c.PerSecond }), unit("%.0f", "")).
			goal("reported", nil),
		r.against(what+"Redis CPU per cycle (machine-dependent)", "", lower, at(func(c *scaleResult) float64 { return us(c.CPU) }), unit("%.1f", "µs")).
			goal("reported", nil),
		r.against(what+"allocations per cycle", "", lower, at(func(c *scaleResult) float64 { return c.Allocs }), unit("%.1f", "allocs")).
			goal("reported", nil),
	}
	// Flat in N: Redis CPU per cycle at the most locks over the same at the target size.
	most := scaleLayouts[len(scaleLayouts)-1].locks()
	growth := func(name string) (float64, bool) {
		a, ok1 := r.scaleOf(most)(name)
		b, ok2 := r.scaleOf(scaleTarget)(name)
		if !ok1 || !ok2 || b.CPU == 0 {
			return 0, false
		}
		return float64(a.CPU) / float64(b.CPU), true
	}
	return append(ts, r.against(fmt.Sprintf("scale: Redis CPU per cycle at %d locks ÷ at %d", most, scaleTarget), "", lower,
		growth, unit("%.2f", "×")).goal("reported", nil))
}
