package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// The report of the instructions counted under callgrind: remutex's targets
// on them, the headline cost tables and the chart's panels.

// instrOf returns a variant's figure of one set of instrResults, if counted.
func (r *results) instrOf(set func(*instrResults) map[string]*instrFigure) func(name string) (*instrFigure, bool) {
	return func(name string) (*instrFigure, bool) {
		if r.Instructions == nil {
			return nil, false
		}
		f, ok := set(r.Instructions)[name]
		return f, ok && f.Instructions > 0
	}
}

func uncontendedSet(ir *instrResults) map[string]*instrFigure { return ir.Uncontended }
func contendedSet(ir *instrResults) map[string]*instrFigure   { return ir.Contended }
func scaleSet(ir *instrResults) map[string]*instrFigure       { return ir.Scale }
func kindsSet(ir *instrResults) map[string]*instrFigure       { return ir.Kinds }

func instructionsOf(f *instrFigure) float64 { return f.Instructions }

// kInstr shows an instruction count in thousands.
func kInstr(x float64) string { return fmt.Sprintf("%.1fk instructions", x/1000) }

// instrTargets are remutex's targets on the instructions redis-server
// executes, and the round trips of the uncontended cycle.
func (r *results) instrTargets() []target {
	unc := metricOf(r.instrOf(uncontendedSet), instructionsOf)
	rtt := firstOf(r.cycleMetric(func(c *cycleResult) float64 { return c.Bursts }),
		metricOf(r.instrOf(uncontendedSet), func(f *instrFigure) float64 { return f.Bursts }))
	own, ownOK := unc(r.remutexName())
	ts := []target{
		r.against("uncontended Lock+Unlock cycle: redis-server instructions (callgrind)", "", lower, unc, kInstr).
			goal("≤ 46k", atMost(46000)),
		r.against("uncontended Lock+Unlock cycle: round trips", "", lower, rtt, unit("%.2f", "")).
			goal("2", atMost(2.005)),
		r.against("contended: redis-server instructions per acquisition (callgrind)", "", lower,
			metricOf(r.instrOf(contendedSet), instructionsOf), kInstr).
			goal("≤ 150k", atMost(150000)),
		r.kindTarget("DistRWMutex RLock", "DistRWMutex RLock", 1.1),
		r.kindTarget(semKind, "DistSemaphore Acquire(1)+Release(1)", 1.2),
		r.kindTarget(onceKind, "DistOnce Do that finds the done record (a value that has not seen it)", 0.5),
		r.against(fmt.Sprintf("%d locks in use (4 clients × 16 goroutines): redis-server instructions per cycle (callgrind)", scaleTarget), "", lower,
			metricOf(r.instrOf(scaleSet), instructionsOf), kInstr).
			goal("≤ remutex's uncontended cycle", func(t target) (bool, bool) { return t.mine <= own, t.mineOK && ownOK }),
	}
	if r.Instructions == nil {
		for i := range ts {
			if i != 1 {
				ts[i].Remutex = "not counted: run with -instructions"
			}
		}
	}
	return ts
}

// kindTarget holds one of remutex's primitives (what names its cycle) to at
// most limit times DistMutex's uncontended cycle, in instructions.
func (r *results) kindTarget(kind, what string, limit float64) target {
	t := target{What: what + ": uncontended cycle, redis-server instructions (callgrind)",
		Goal: fmt.Sprintf("≤ %.1f× DistMutex's Lock+Unlock", limit), ratio: math.NaN()}
	of := r.instrOf(kindsSet)
	k, ok1 := of(kind)
	m, ok2 := of("DistMutex")
	if !ok1 || !ok2 {
		return t
	}
	x := k.Instructions / m.Instructions
	t.Remutex, t.Peer, t.Ratio = kInstr(k.Instructions), "DistMutex "+kInstr(m.Instructions), fmt.Sprintf("%.2f×", x)
	t.Known, t.Met = true, x <= limit
	return t
}

// firstOf is the first of the metrics that has a variant's figure.
func firstOf(ms ...metric) metric {
	return func(name string) (float64, bool) {
		for _, m := range ms {
			if x, ok := m(name); ok {
				return x, true
			}
		}
		return 0, false
	}
}

// instructions writes the headline cost tables.
func (w *page) instructions(r *results) {
	ir := r.Instructions
	if ir == nil {
		return
	}
	w.p("## Cost in redis-server instructions (callgrind)\n\n")
	w.p("Each figure is the instructions redis-server executed per operation, counted by valgrind's callgrind (%s): "+
		"a count that does not move with the machine's load, unlike time, and that is the same on any machine with the same "+
		"redis-server build. Every variant runs on a fresh server of its own, started under callgrind with the usual settings "+
		"(hz 10, no persistence) and %s, warmed up with 1000 PINGs. A figure is counted in %d windows of the same number of operations, "+
		"each on fresh clients after their warm-up: the counters are zeroed before a window and dumped after it "+
		"(`callgrind_control -z`, `-d`). redis-server's periodic work (serverCron: statistics, clients, active expiry), which "+
		"costs instructions in proportion to wall time and so would grow with callgrind's slowness, is left out: its inclusive count "+
		"is read from the dump. *in scripts* is the part inside script calls (EVAL, EVALSHA: the inclusive count of `%s`). "+
		"*windows* shows each window's figure and how far apart they are. Counting took %v.\n\n",
		ir.Valgrind, seedText(ir.FixedSeed), instrWindows, scriptFunc, ir.Took.Round(1e9))
	w.instrCycles(r)
	w.instrContended(r)
	w.instrScripts(r)
	w.instrKinds(r)
	w.instrScale(r)
}

// seedText says how the servers' hash seed was chosen (see
// callgrindCommand).
func seedText(fixed bool) string {
	if fixed {
		return "a fixed hash seed (so that a command's bucket in the command table, which moves a count by 65 instructions, is the same in every run)"
	}
	return "a random hash seed (it could not be fixed: a command's bucket in the command table moves a count by 65 instructions, up to 1% of a cycle, from run to run)"
}

// windows shows a figure's windows and their spread.
func windows(f *instrFigure) string {
	return fmt.Sprintf("%s (%.2f%%)", kilo(f.Windows...), 100*f.Agreement)
}

// ratioTo shows remutex's figure over a peer's, empty for remutex.
func ratioTo(mine *instrFigure, f *instrFigure, remutex bool) string {
	if mine == nil || remutex || f.Instructions == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f", mine.Instructions/f.Instructions)
}

func (w *page) instrCycles(r *results) {
	ir := r.Instructions
	w.p("### Uncontended Lock+Unlock cycle\n\nOne client, one lock, %d cycles per window. *2 PINGs* is the floor: two round trips "+
		"through go-redis, counted by the same harness.\n\n", instrCycles)
	w.p("| library | instructions/cycle | × 2 PINGs | in scripts | round trips | commands | executed | allocs | windows | remutex ÷ this |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	floor := ir.Floor
	row := func(name string, f *instrFigure, remutex bool) {
		ratio := ratioTo(ir.Uncontended[r.remutexName()], f, remutex || f == floor)
		xf := ""
		if floor != nil && floor.Instructions > 0 {
			xf = fmt.Sprintf("%.2f", f.Instructions/floor.Instructions)
		}
		w.p("| %s | %.1fk | %s | %.1fk | %.2f | %.2f | %.1f | %.1f | %s | %s |\n", bold(name, remutex), f.Instructions/1000, xf,
			f.InScripts/1000, f.Bursts, f.Commands, f.Executed, f.Allocs, windows(f), ratio)
	}
	if floor != nil {
		row(floorName, floor, false)
	}
	for _, v := range r.Variants {
		if f, ok := ir.Uncontended[v.Name]; ok {
			row(v.Name, f, v.Remutex)
		}
	}
	w.p("\n")
}

func (w *page) instrContended(r *results) {
	ir := r.Instructions
	if len(ir.Contended) == 0 {
		return
	}
	w.p("### Contended acquisition\n\n%d clients × %d goroutines on one lock, hold %v (time.Sleep), pause %v after Unlock, as in (b); "+
		"a window ends at its %dth acquisition, and counts every acquisition and instruction up to the end of the drain that follows. "+
		"Under callgrind the server is 20 to 50 times slower than usual, so it, not the hold, sets the pace (*acq/s* under callgrind): "+
		"a waiter that polls polls more often per acquisition than at full speed, and what a library does per second (rueidis PINGs "+
		"idle connections every second) weighs more per acquisition. So a polling library's figure is the cost of an acquisition on a "+
		"server that is the bottleneck; remutex's waiters do not poll, and its figure is what a hand-off costs the server.\n\n",
		contClients, contPerClient, contCritical, contPause, instrAcquisitions)
	w.p("| library | instructions/acq | in scripts | round trips/acq | commands/acq | executed/acq | acq/s under callgrind | windows | remutex ÷ this |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---|---:|\n")
	mine := ir.Contended[r.remutexName()]
	for _, v := range r.Variants {
		if f, ok := ir.Contended[v.Name]; ok {
			w.p("| %s | %.1fk | %.1fk | %.2f | %.2f | %.1f | %.0f | %s | %s |\n", bold(v.Name, v.Remutex), f.Instructions/1000, f.InScripts/1000,
				f.Bursts, f.Commands, f.Executed, f.PerSecond, windows(f), ratioTo(mine, f, v.Remutex))
		}
	}
	w.p("\n")
}

// instrScripts writes remutex's script calls per operation, from the server
// that dumped after every script call.
func (w *page) instrScripts(r *results) {
	ir := r.Instructions
	if len(ir.Scripts) == 0 {
		return
	}
	w.p("### remutex per script call\n\nThe cycle and the hand-off once more, on a server that dumps after every script call "+
		"(`--zero-before=%[1]s --dump-after=%[1]s`), while the clients let one script call at a time reach it and note each "+
		"call's script and reply: the n'th dump is the n'th call. A script is named by its first comment, and the path it took "+
		"by its reply (acquire: the fence token, 0 or n, granted, or queued; release: 1 done, 2 handed to the head of the queue; "+
		"quick_lock: the fence, 0, or -1 not free; an uncontended release is no script: HDEL and EXISTS). "+
		"Instructions here are those inside the script call alone; "+
		"the rest of an operation's count is reading the commands, writing the replies and the pub/sub messages, and the event loop. "+
		"The mean per call is what the server pays; the median is a call without a garbage collection step of Lua's heap, "+
		"which redis-server runs in every 50th script call, and Lua wherever a call's allocations call for one.\n\n", scriptFunc)
	w.p("| operation | script reply | calls per operation | instructions per call: mean | median | per operation |\n|---|---|---:|---:|---:|---:|\n")
	for _, op := range []string{"uncontended", "contended"} {
		f, ok := ir.Scripts[op]
		if !ok {
			continue
		}
		var sum float64
		for _, k := range slices.Sorted(maps.Keys(f.Scripts)) {
			s := f.Scripts[k]
			sum += s.Calls * s.Instructions
			w.p("| %s | %s | %.3f | %.1fk | %.1fk | %.1fk |\n", op, strings.Replace(k, " ", " → ", 1), s.Calls, s.Instructions/1000,
				s.Median/1000, s.Calls*s.Instructions/1000)
		}
		w.p("| %s | all scripts | | | | **%.1fk** |\n", op, sum/1000)
	}
	w.p("\n")
}

func (w *page) instrKinds(r *results) {
	ir := r.Instructions
	if len(ir.Kinds) == 0 {
		return
	}
	w.p("### remutex's primitives, uncontended\n\nEach primitive's take and give back on one client, %d per window "+
		"(DistSemaphore: Acquire(1)+Release(1) on a semaphore of %d permits; %s: a Do of a once that is done, "+
		"by a new value each time, which has not seen the record).\n\n", instrCycles, semSize, onceKind)
	w.p("| primitive | instructions/cycle | ÷ DistMutex | in scripts | round trips | commands | executed | allocs | windows |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	base := ir.Kinds["DistMutex"]
	for _, v := range lockKinds() {
		f, ok := ir.Kinds[v.name]
		if !ok {
			continue
		}
		x := ""
		if base != nil && base.Instructions > 0 {
			x = fmt.Sprintf("%.2f", f.Instructions/base.Instructions)
		}
		w.p("| %s | %.1fk | %s | %.1fk | %.2f | %.2f | %.1f | %.1f | %s |\n", v.name, f.Instructions/1000, x, f.InScripts/1000, f.Bursts, f.Commands, f.Executed, f.Allocs, windows(f))
	}
	w.p("\n")
}

func (w *page) instrScale(r *results) {
	ir := r.Instructions
	if len(ir.Scale) == 0 {
		return
	}
	l := scaleLayoutOf(scaleTarget)
	w.p("### %d locks in use at once\n\n%d clients × %d goroutines, each cycling a lock of its own, no contention, as in (f); "+
		"%d cycles per window, shared out evenly. Libraries that send the calls of concurrent goroutines together (batching) "+
		"take fewer round trips than cycles.\n\n", l.locks(), l.Clients, l.PerClient, instrScaleCycles)
	w.p("| library | instructions/cycle | ÷ its uncontended cycle | in scripts | round trips | commands | allocs | windows | remutex ÷ this |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---|---:|\n")
	mine := ir.Scale[r.remutexName()]
	for _, v := range r.Variants {
		f, ok := ir.Scale[v.Name]
		if !ok {
			continue
		}
		x := ""
		if u, ok := ir.Uncontended[v.Name]; ok && u.Instructions > 0 {
			x = fmt.Sprintf("%.2f", f.Instructions/u.Instructions)
		}
		w.p("| %s | %.1fk | %s | %.1fk | %.2f | %.2f | %.1f | %s | %s |\n", bold(v.Name, v.Remutex), f.Instructions/1000, x, f.InScripts/1000,
			f.Bursts, f.Commands, f.Allocs, windows(f), ratioTo(mine, f, v.Remutex))
	}
	w.p("\n")
}

// instrPanels chart the instructions, first: they are the headline costs.
func instrPanels(r *results) []panel {
	if r.Instructions == nil {
		return nil
	}
	var panels []panel
	for _, c := range []struct {
		title string
		set   func(*instrResults) map[string]*instrFigure
	}{
		{"Uncontended cycle: redis-server instructions (callgrind, lower is better)", uncontendedSet},
		{"Contended: redis-server instructions per acquisition (callgrind, lower is better)", contendedSet},
		{fmt.Sprintf("%d locks in use: redis-server instructions per cycle (callgrind, lower is better)", scaleTarget), scaleSet},
	} {
		pn := panel{title: c.title, unit: "k"}
		of := r.instrOf(c.set)
		for _, v := range r.Variants {
			if f, ok := of(v.Name); ok {
				pn.bars = append(pn.bars, bar{v.Name, f.Instructions / 1000, v.Remutex})
			}
		}
		if len(panels) == 0 && r.Instructions.Floor != nil {
			pn.ref, pn.refLb = r.Instructions.Floor.Instructions/1000, "2 PINGs"
		}
		if len(pn.bars) > 0 {
			panels = append(panels, pn)
		}
	}
	return panels
}
