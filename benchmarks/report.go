package main

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
	"time"
)

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func jsonOf(r *results) []byte {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return []byte(fmt.Sprintf("{\"error\": %q}\n", err.Error()))
	}
	return append(b, '\n')
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

// best returns the peer (not remutex) with the best value of f, lower or
// higher being better, among those f reports for.
func (r *results) best(f metric, lower bool) (string, float64, bool) {
	name, val, found := "", 0.0, false
	for _, v := range r.Variants {
		if v.Remutex {
			continue
		}
		x, ok := f(v.Name)
		if !ok || math.IsNaN(x) {
			continue
		}
		if !found || (lower && x < val) || (!lower && x > val) {
			name, val, found = v.Name, x, true
		}
	}
	return name, val, found
}

func (r *results) cycleOf(name string) (*cycleResult, bool) {
	c, ok := r.Uncontended[name]
	return c, ok && c.Cycles > 0
}

func (r *results) contendedOf(name string) (*contendedResult, bool) {
	c, ok := r.Contended[name]
	return c, ok && c.Acquisitions > 0
}

// metric is one figure of a variant, false where it was not measured.
type metric func(name string) (float64, bool)

// cycleMetric returns the figure sel picks from each variant's uncontended
// cycle.
func (r *results) cycleMetric(sel func(*cycleResult) float64) metric {
	return func(n string) (float64, bool) {
		c, ok := r.cycleOf(n)
		if !ok {
			return 0, false
		}
		return sel(c), true
	}
}

// contendedMetric returns the figure sel picks from each variant's contended
// hand-off.
func (r *results) contendedMetric(sel func(*contendedResult) float64) metric {
	return func(n string) (float64, bool) {
		c, ok := r.contendedOf(n)
		if !ok {
			return 0, false
		}
		return sel(c), true
	}
}

// perPeriod is the round trips of the held scenario per renewal period
// (lease/3).
func (h *heldResult) perPeriod() float64 {
	return float64(h.Bursts) / (float64(h.Held) / float64(h.Lease/3))
}

// target is one of remutex's targets, as measured.
type target struct {
	What, Goal, Remutex, Peer, Ratio string
	Met, Known                       bool
}

func (r *results) targets() []target {
	cyc, cont := r.cycleMetric, r.contendedMetric
	ts := []target{
		r.vsPeer("uncontended Lock+Unlock cycle", "≤ 0.9× fastest peer", cyc(func(c *cycleResult) float64 { return us(c.Cycle) }),
			true, 0.9, "µs", "%.1f"),
		r.vsPeer("allocations per cycle", "≤ 0.75× fewest of any peer", cyc(func(c *cycleResult) float64 { return c.Allocs }),
			true, 0.75, "allocs", "%.1f"),
		r.vsPeer("contended lock utilisation", "≥ best peer", cont(func(c *contendedResult) float64 { return 100 * c.Utilisation }),
			false, 1, "%", "%.1f"),
	}
	if c, ok := r.contendedOf(r.remutexName()); ok {
		ts = append(ts,
			target{What: "contended wait p99", Goal: "≤ 20 ms", Remutex: fmt.Sprintf("%.2f ms", ms(c.WaitP99)),
				Met: c.WaitP99 <= 20*time.Millisecond, Known: true},
			target{What: "contended wait max", Goal: "≤ 50 ms", Remutex: fmt.Sprintf("%.2f ms", ms(c.WaitMax)),
				Met: c.WaitMax <= 50*time.Millisecond, Known: true})
	}
	ts = append(ts, r.vsPeer("Redis CPU per acquisition (contended)", "≤ 0.8× best peer",
		cont(func(c *contendedResult) float64 { return us(c.CPU) }), true, 0.8, "µs", "%.1f"))
	if h, ok := r.Held[r.remutexName()]; ok {
		rtt := h.perPeriod()
		ts = append(ts, target{What: fmt.Sprintf("%d held locks renewed", h.Locks), Goal: "by one goroutine, in batched round trips (≤ 2 per lease/3)",
			Remutex: fmt.Sprintf("%.1f round trips per renewal period (lease/3), +%d goroutines, %d lost", rtt, h.Goroutines, h.Lost),
			Known:   true, Met: rtt <= 2 && h.Goroutines <= 2 && h.Lost == 0 && h.Taken == h.Locks})
	}
	return ts
}

// vsPeer is a target relative to the best peer: remutex's figure f over the
// peer's with the lowest (lower) or highest figure must be at most (lower) or
// at least limit.
func (r *results) vsPeer(what, goal string, f metric, lower bool, limit float64, unit, format string) target {
	t := target{What: what, Goal: goal}
	mine, ok := f(r.remutexName())
	pn, pv, pok := r.best(f, lower)
	if !ok || !pok {
		return t
	}
	t.Known = true
	t.Remutex = fmt.Sprintf(format+" %s", mine, unit)
	t.Peer = fmt.Sprintf(format+" %s (%s)", pv, unit, pn)
	q := mine / pv
	t.Ratio = fmt.Sprintf("%.2f×", q)
	if lower {
		t.Met = q <= limit
	} else {
		t.Met = q >= limit
	}
	return t
}

// markdown renders the report: the machine, the floor, the targets and one
// table per scenario.
func markdown(r *results) string {
	w := &page{}
	w.header(r)
	w.machine(r)
	w.floor(r)
	w.targets(r)
	w.uncontended(r)
	w.contended(r)
	w.held(r)
	w.nested(r)
	w.configurations(r)
	return w.String()
}

// page is a report being written.
type page struct{ strings.Builder }

func (w *page) p(format string, args ...any) { fmt.Fprintf(w, format, args...) }

func (w *page) header(r *results) {
	mode := "full run"
	cmd := "go run . -out results"
	if r.Plan.Short {
		mode = "short run (-short): few samples, indicative only"
		cmd = "go run . -short -out <dir>"
	}
	w.p("# remutex and other Go Redis locks\n\n")
	w.p("Measured %s in one run (%s, %s). Reproduce from `benchmarks/`: `%s`.\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), mode, r.Took.Round(time.Second), cmd)
}

func (w *page) machine(r *results) {
	w.p("## Machine\n\n| | |\n|---|---|\n")
	m := r.Machine
	w.p("| CPU | %s |\n| cores | %d (GOMAXPROCS %d) |\n| OS | %s, kernel %s |\n| Go | %s |\n| redis-server | %s, on %s (loopback, no persistence) |\n",
		m.CPU, m.Cores, m.GOMAXPROCS, m.OS, m.Kernel, m.Go, m.Redis, m.RedisAddr)
	waited := ""
	if r.Plan.AwaitLoad > 0 {
		waited = fmt.Sprintf(" (the run waited for a 1-minute load below %.2f, for up to 10 minutes)", r.Plan.AwaitLoad)
	}
	w.p("| load average (1, 5, 15 min) | %s at start, %s at end%s |\n", m.LoadStart, m.LoadEnd, waited)
	mods := make([]string, 0, len(m.Modules))
	for k, v := range m.Modules {
		mods = append(mods, k+" "+v)
	}
	slices.Sort(mods)
	w.p("| modules | %s |\n\n", strings.Join(mods, ", "))
}

func (w *page) floor(r *results) {
	w.p("## Floor\n\nOne round trip is a PING answered on the same connection, one after the other, measured in every "+
		"round of the uncontended scenario next to the libraries: **%.1f µs** through go-redis (p50 %.1f µs), "+
		"%.1f µs on a bare socket (p50 %.1f µs). "+
		"A Lock+Unlock cycle cannot cost less than two round trips (%.1f µs); a nested Lock or Unlock not less than one. "+
		"Hand-off gaps below are in units of the go-redis round trip.\n\n",
		us(r.Floor.RTT), us(r.Floor.P50), us(r.Floor.Raw), us(r.Floor.RawP50), 2*us(r.Floor.RTT))
}

func (w *page) targets(r *results) {
	ts := r.targets()
	if len(ts) == 0 {
		return
	}
	w.p("## Targets for remutex\n\n| target | goal | remutex | best peer | ratio | met |\n|---|---|---|---|---|---|\n")
	for _, t := range ts {
		met := "—"
		if t.Known {
			met = "no"
			if t.Met {
				met = "yes"
			}
		}
		w.p("| %s | %s | %s | %s | %s | %s |\n", t.What, t.Goal, t.Remutex, t.Peer, t.Ratio, met)
	}
	w.p("\n")
}

func (w *page) uncontended(r *results) {
	if len(r.Uncontended) == 0 {
		return
	}
	w.p("## (a, e) Uncontended Lock+Unlock cycle\n\n")
	w.p("One client, one lock, cycles back to back for %d rounds of %v per library, the rounds interleaved. "+
		"*cycle* is the median of the rounds' mean cycle time; *× floor* divides it by two PING round trips. "+
		"Round trips are write bursts counted on the client's sockets; commands are what clients sent "+
		"(RESP arrays counted on their sockets), *executed* is what the server ran, counting the commands run inside scripts (INFO commandstats). "+
		"Allocations are heap allocations of the whole process per cycle (runtime.MemStats), background goroutines included.\n\n",
		r.Plan.Rounds, r.Plan.RoundTime)
	w.p("| library | cycle µs | p50 µs | p99 µs | × floor | round trips | commands | executed | Redis CPU µs | allocs | bytes | remutex ÷ this (time) | remutex ÷ this (allocs) |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	mine, _ := r.cycleOf(r.remutexName())
	for _, v := range r.Variants {
		c, ok := r.cycleOf(v.Name)
		if !ok {
			w.p("| %s | failed |||||||||||| \n", v.Name)
			continue
		}
		rt, ra := "", ""
		if mine != nil && !v.Remutex {
			rt = fmt.Sprintf("%.2f", float64(mine.Cycle)/float64(c.Cycle))
			ra = fmt.Sprintf("%.2f", mine.Allocs/c.Allocs)
		}
		w.p("| %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f | %s | %s |\n",
			bold(v.Name, v.Remutex), us(c.Cycle), us(c.P50), us(c.P99), float64(c.Cycle)/float64(2*r.Floor.RTT),
			c.Bursts, c.Commands, c.Executed, us(c.CPU), c.Allocs, c.Bytes, rt, ra)
	}
	w.p("\n")
}

func (w *page) contended(r *results) {
	if len(r.Contended) == 0 {
		return
	}
	rtt := r.Floor.RTT
	w.p("## (b) Contended hand-off\n\n")
	w.p("%d clients (separate connection pools) × %d goroutines on one lock for %v. A holder sleeps %v "+
		"(time.Sleep, so the critical section includes the timer's overshoot) and pauses %v after Unlock. "+
		"*util* is time held over wall time; *gap* runs from the Unlock call to the next holder's Lock returning "+
		"(in round trips: ÷ %.1f µs); *wait* runs from the Lock call to its return; *spread* is the most over the "+
		"fewest acquisitions of one worker; *overlaps* counts holders that found another holder inside (must be 0). "+
		"Per acquisition: round trips of all clients, commands, Redis CPU (INFO cpu, user+sys).\n\n",
		contClients, contPerClient, r.Plan.ContendedTime, contCritical, contPause, us(rtt))
	w.p("| library | acq/s | util %% | gap µs | gap RTT | wait p50 ms | wait p99 ms | wait max ms | spread | overlaps | round trips/acq | commands/acq | executed/acq | Redis CPU µs/acq | remutex ÷ this (CPU) |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	mine := r.Contended[r.remutexName()]
	for _, v := range r.Variants {
		c, ok := r.Contended[v.Name]
		if !ok {
			w.p("| %s | failed ||||||||||||||\n", v.Name)
			continue
		}
		rc := ""
		if mine != nil && !v.Remutex && c.CPU > 0 {
			rc = fmt.Sprintf("%.2f", float64(mine.CPU)/float64(c.CPU))
		}
		w.p("| %s | %.0f | %.1f | %.0f | %.1f | %.2f | %.2f | %.2f | %s | %d | %.2f | %.2f | %.1f | %.1f | %s |\n",
			bold(v.Name, v.Remutex), c.PerSecond, 100*c.Utilisation, us(c.GapMean), float64(c.GapMean)/float64(rtt),
			ms(c.WaitP50), ms(c.WaitP99), ms(c.WaitMax), spread(c.Spread), c.Overlaps,
			c.Bursts, c.Commands, c.Executed, us(c.CPU), rc)
	}
	w.p("\nAcquisitions per worker: ")
	var parts []string
	for _, v := range r.Variants {
		if c, ok := r.Contended[v.Name]; ok {
			parts = append(parts, fmt.Sprintf("%s %v", v.Name, c.PerWorker))
		}
	}
	w.p("%s.\n\n", strings.Join(parts, "; "))
}

func (w *page) held(r *results) {
	if len(r.Held) == 0 {
		return
	}
	var any *heldResult
	for _, h := range r.Held {
		any = h
	}
	w.p("## (c) %d locks held by one client\n\n", any.Locks)
	w.p("One goroutine takes %d locks (lease %v) and holds them for three lease periods (%v). "+
		"Counted over those %v: round trips (write bursts on the client's sockets), commands sent, commands executed, "+
		"Redis CPU, and the most goroutines above the count before the client existed; a library is measured with the locks it "+
		"took in %v if it takes longer. "+
		"redsync and redislock have no watchdog: what a user must write is measured instead, a loop of %d goroutines that "+
		"extends every lock every lease/3, one round trip per lock. rueidislock's locks renew themselves, with a goroutine "+
		"per key of each lock. remutex uses reentrant mutexes (the default): holds belong to goroutines, "+
		"and one goroutine may hold any number of distinct locks; its single watchdog renews every hold.\n\n",
		any.Locks, any.Lease, any.Held, any.Held, r.Plan.TakeLimit, userRenewers)
	w.p("| library | renewed by | round trips | per lease/3 | commands | executed | Redis CPU ms | +goroutines | lost | taking all locks |\n")
	w.p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range r.Variants {
		h, ok := r.Held[v.Name]
		if !ok {
			continue
		}
		took := h.AcquireTime.Round(time.Millisecond).String()
		if h.Taken < h.Locks {
			took = fmt.Sprintf("only %d in %v", h.Taken, h.AcquireTime.Round(time.Millisecond))
		}
		w.p("| %s | %s | %d | %.1f | %d | %d | %.1f | %d | %d | %s |\n",
			bold(v.Name, v.Remutex), h.Renewer, h.Bursts, h.perPeriod(), h.Commands, h.Executed,
			ms(h.CPU), h.Goroutines, h.Lost, took)
	}
	w.p("\n")
}

func (w *page) nested(r *results) {
	n := r.Nested
	if n == nil {
		return
	}
	w.p("## (d) Nested Lock+Unlock (remutex)\n\n")
	w.p("A goroutine that holds the lock locks and unlocks it again, %d times. Each nested call costs one round trip "+
		"(the script sets the hold count and renews the lease).\n\n", n.Pairs)
	w.p("| | mean µs | p50 µs | × PING (mean) | × PING (p50) |\n|---|---:|---:|---:|---:|\n")
	w.p("| PING, interleaved (the 1-round-trip floor) | %.1f | %.1f | 1 | 1 |\n", us(n.Ping), us(n.PingP50))
	w.p("| nested Lock | %.1f | %.1f | %.2f | %.2f |\n", us(n.Lock), us(n.LockP50), float64(n.Lock)/float64(n.Ping), float64(n.LockP50)/float64(n.PingP50))
	w.p("| nested Unlock | %.1f | %.1f | %.2f | %.2f |\n", us(n.Unlock), us(n.UnlockP50), float64(n.Unlock)/float64(n.Ping), float64(n.UnlockP50)/float64(n.PingP50))
	w.p("\nPer nested Lock+Unlock pair: %.2f round trips, %.2f commands sent, %.1f executed, %.1f allocations.\n\n",
		n.Bursts, n.Commands, n.Executed, n.Allocs)
}

func (w *page) configurations(r *results) {
	w.p("## Configurations\n\n| library | options |\n|---|---|\n")
	for _, v := range r.Variants {
		w.p("| %s | %s |\n", v.Name, v.Setup)
	}
	w.p("\nEvery library runs on go-redis v9 with default options except rueidislock, which brings its own client (rueidis). " +
		"Each Lock that a library lets fail (redsync after its tries, redislock after its ttl) is retried by the harness, " +
		"as a caller would.\n")
	if len(r.Problems) > 0 || len(r.Violations) > 0 {
		w.p("\n## Problems\n\n")
		for _, s := range r.Violations {
			w.p("- violation: %s\n", s)
		}
		for _, s := range r.Problems {
			w.p("- %s\n", s)
		}
	}
}

func bold(s string, on bool) string {
	if on {
		return "**" + s + "**"
	}
	return s
}

func spread(x float64) string {
	if x < 0 {
		return "∞"
	}
	return fmt.Sprintf("%.2f", x)
}

// ---------------------------------------------------------------- chart

type bar struct {
	label string
	v     float64
	hi    bool
}

type panel struct {
	title string
	unit  string
	log   bool
	bars  []bar
	ref   float64 // a reference line (floor, limit), 0 for none
	refLb string
}

// chart draws the main comparisons as horizontal bar panels, remutex in its
// own colour.
func chart(r *results) string {
	panels := chartPanels(r)
	height := chartTop
	for _, pn := range panels {
		height += pn.height()
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartWidth, height, chartWidth, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="24" font-size="16" font-weight="bold">remutex and other Go Redis locks: %s</text>`+"\n",
		html.EscapeString(r.Started.UTC().Format("2006-01-02")+", "+r.Machine.CPU+", "+fmt.Sprint(r.Machine.Cores)+" cores, redis "+r.Machine.Redis))
	y := chartTop
	for _, pn := range panels {
		pn.draw(&b, y)
		y += pn.height()
	}
	p("</svg>\n")
	return b.String()
}

// The chart's layout, in pixels.
const (
	chartWidth = 900
	chartTop   = 50  // the title above the first panel
	barLeft    = 150 // labels to the left, bars to the right
	barW       = 600 // the longest bar
	rowH       = 20
	titleH     = 28
	panelGap   = 18
)

// chartPanels returns the panels of the chart, one per comparison that has
// any bars.
func chartPanels(r *results) []panel {
	var panels []panel
	add := func(title, unit string, log bool, ref float64, refLb string, f func(name string) (float64, bool)) {
		pn := panel{title: title, unit: unit, log: log, ref: ref, refLb: refLb}
		for _, v := range r.Variants {
			if x, ok := f(v.Name); ok && x > 0 && !math.IsInf(x, 0) {
				pn.bars = append(pn.bars, bar{v.Name, x, v.Remutex})
			}
		}
		if len(pn.bars) > 0 {
			panels = append(panels, pn)
		}
	}
	cyc := r.cycleMetric
	cont := r.contendedMetric
	add("Uncontended Lock+Unlock cycle (lower is better)", "µs", false, 2*us(r.Floor.RTT), "2 PINGs",
		cyc(func(c *cycleResult) float64 { return us(c.Cycle) }))
	add("Allocations per cycle (lower is better)", "allocs", false, 0, "",
		cyc(func(c *cycleResult) float64 { return c.Allocs }))
	add("Contended: lock utilisation, time held / wall time (higher is better)", "%", false, 0, "",
		cont(func(c *contendedResult) float64 { return 100 * c.Utilisation }))
	add("Contended: mean hand-off gap in round trips (lower is better, log scale)", "RTT", true, 0, "",
		cont(func(c *contendedResult) float64 { return float64(c.GapMean) / float64(r.Floor.RTT) }))
	add("Contended: wait p99 (lower is better, log scale)", "ms", true, 20, "20 ms",
		cont(func(c *contendedResult) float64 { return ms(c.WaitP99) }))
	add("Contended: Redis CPU per acquisition (lower is better)", "µs", false, 0, "",
		cont(func(c *contendedResult) float64 { return us(c.CPU) }))
	add("Many held locks: renewal round trips per lease/3 (lower is better, log scale)", "", true, 0, "",
		func(n string) (float64, bool) {
			h, ok := r.Held[n]
			if !ok {
				return 0, false
			}
			return h.perPeriod(), true
		})
	return panels
}

func (pn panel) height() int { return titleH + rowH*len(pn.bars) + panelGap }

// draw writes the panel with its top at y.
func (pn panel) draw(b *strings.Builder, y int) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p(`<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+16, html.EscapeString(pn.title))
	y += titleH
	scale := pn.scale()
	for i, br := range pn.bars {
		yy := y + i*rowH
		fill := "#9aa5b1"
		if br.hi {
			fill = "#d9480f"
		}
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", barLeft-8, yy+14, html.EscapeString(br.label))
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", barLeft, yy+3, max(scale(br.v), 1), rowH-6, fill)
		p(`<text x="%.1f" y="%d">%s %s</text>`+"\n", float64(barLeft)+max(scale(br.v), 1)+4, yy+14, num(br.v), pn.unit)
	}
	if pn.ref > 0 {
		x := float64(barLeft) + scale(pn.ref)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#1c7ed6" stroke-dasharray="4 3"/>`+"\n", x, y, x, y+rowH*len(pn.bars))
		p(`<text x="%.1f" y="%d" fill="#1c7ed6" font-size="10">%s</text>`+"\n", x+3, y-2, html.EscapeString(pn.refLb))
	}
}

// scale returns the length of a bar of value v: linear from 0 to the largest
// value, or logarithmic from half the smallest.
func (pn panel) scale() func(v float64) float64 {
	hi := pn.ref
	lo := math.Inf(1)
	for _, br := range pn.bars {
		hi = max(hi, br.v)
		lo = min(lo, br.v)
	}
	if pn.ref > 0 {
		lo = min(lo, pn.ref)
	}
	lo /= 2
	return func(v float64) float64 {
		if pn.log {
			if v <= lo {
				return 0
			}
			return barW * math.Log(v/lo) / math.Log(hi/lo)
		}
		return barW * v / hi
	}
}

func num(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
