package main

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	xtrace "golang.org/x/exp/trace"
)

// Goroutine switches of a hand-off, which the machine's load cannot move: a
// short phase after the timed rounds runs a pair under the runtime's
// tracer, each measured hand-off a trace task (hoTraceTask) with a region
// around the release call on the releaser's goroutine and one around the
// await on the waiter's. The trace is read back with golang.org/x/exp/trace.
//
// Attribution. A goroutine belongs to the client whose side goroutine it
// descends from: each side builds its client on its own goroutine (and logs
// hoTraceSide first), so every goroutine the client starts, and every one
// those start, has it as an ancestor in the trace's creation events.
// Goroutines with no side ancestor (the runtime's, the timers' callbacks,
// the driver) are *other*. A goroutine is named by the function it was
// started with (the creation event's new stack).
//
// Per hand-off, from the release region's beginning (t0) to the await
// region's end (t1):
//   - switches: goroutines put on a processor (Runnable → Running) in
//     [t0, t1], on the releaser's client, on the waiter's client, and other;
//   - releaser's path: those of the releaser's client before its first
//     socket write after t0 (the release leaving the process);
//   - waiter's chain: from the waiter's last start back through whoever
//     made each goroutine runnable (unblocked or created it), while that was
//     a goroutine started inside the span; it ends at a wake-up by no
//     goroutine (the network poller) or at a goroutine running since before
//     t0. Its length is the switches from the message's arrival to the
//     waiter's return.
const (
	hoTraceTask    = "handoff"
	hoTraceRelease = "release"
	hoTraceAwait   = "await"
	hoTraceSide    = "handoff side"
)

// switchResult is the goroutine switches of one variant's traced hand-offs:
// medians per hand-off.
type switchResult struct {
	Name     string
	Handoffs int           // found in the trace
	P50      time.Duration // hand-off time, the tracer's overhead included
	Total    float64       // switches in [t0, t1]
	Releaser float64       // of those, on the releaser's client
	Waiter   float64       // on the waiter's client
	Other    float64       // neither
	Created  float64       // goroutines created in [t0, t1]
	// The hand-off split where the network poller woke the waiter's chain
	// (medians, under the tracer): the release through Redis to the
	// message's arrival, and the arrival to the waiter's return.
	ToArrival, FromArrival time.Duration
	// ToWrite is from the release call to the releaser's side's first
	// socket write (median): the client's part of ToArrival.
	ToWrite time.Duration
	// Writes is the releaser's side's socket writes before the message
	// arrived (median): its round trips on the way.
	Writes  float64
	Path    float64    // releaser's client, before its first socket write
	Chain   float64    // the waiter's chain
	Paths   []seqCount // the releaser's paths, most frequent first
	Chains  []seqCount // the waiter's chains, most frequent first
	Sides   []seqCount // the releaser's side's switches in order, then the waiter's side's
	Started []seqCount // every goroutine started in [t0, t1], by its name: how many hand-offs started it
}

// seqCount is a sequence of goroutines and in how many hand-offs it was seen.
type seqCount struct {
	Seq string
	N   int
}

// summary is the switches in words, for the targets.
func (s *switchResult) summary() string {
	return fmt.Sprintf("%.0f (releaser's side %.0f, of them before its write %.0f; waiter's side %.0f, chain from the network %.0f; other %.0f)",
		s.Total, s.Releaser, s.Path, s.Waiter, s.Chain, s.Other)
}

// traceHandoffs runs n hand-offs of v under the runtime tracer and counts
// their goroutine switches.
func traceHandoffs(v hoVariant, srv *server, n int) (switchResult, error) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		return switchResult{}, err
	}
	lat, err := handoffRound(v, srv, span{ops: max(1, n)}, true)
	trace.Stop()
	if err != nil {
		return switchResult{}, err
	}
	res, err := countSwitches(&buf)
	if err != nil {
		return res, fmt.Errorf("reading the trace: %w", err)
	}
	if res.Handoffs != len(lat) {
		return res, fmt.Errorf("%d hand-offs in the trace, %d made", res.Handoffs, len(lat))
	}
	res.Name = v.name
	slices.Sort(lat)
	res.P50 = percentile(lat, 0.5)
	return res, nil
}

// goTrans is one state transition of a goroutine.
type goTrans struct {
	t        xtrace.Time
	g        xtrace.GoID
	from, to xtrace.GoState
	by       xtrace.GoID // the goroutine that made the transition happen (unblocker, creator)
	write    bool        // entering a system call that writes to a socket
}

// goInfo is what the trace says of a goroutine.
type goInfo struct {
	creator xtrace.GoID
	start   string // the function it was started with
	side    int    // the side it logged, or -1
	trans   []int  // its transitions, indices into the trace's
}

// hoSpan is one hand-off in the trace.
type hoSpan struct {
	t0, t1    xtrace.Time
	rel, wait xtrace.GoID
	began     bool
}

// goTrace is a trace read back.
type goTrace struct {
	g     map[xtrace.GoID]*goInfo
	trans []goTrans
	spans map[xtrace.TaskID]*hoSpan
	order []xtrace.TaskID
}

func (tr *goTrace) info(g xtrace.GoID) *goInfo {
	gi := tr.g[g]
	if gi == nil {
		gi = &goInfo{creator: xtrace.NoGoroutine, side: -1}
		tr.g[g] = gi
	}
	return gi
}

// readTrace reads the events that matter here.
func readTrace(r io.Reader) (*goTrace, error) {
	rd, err := xtrace.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := &goTrace{g: map[xtrace.GoID]*goInfo{}, spans: map[xtrace.TaskID]*hoSpan{}}
	for {
		e, err := rd.ReadEvent()
		if errors.Is(err, io.EOF) {
			return tr, nil
		}
		if err != nil {
			return nil, err
		}
		tr.add(e)
	}
}

func (tr *goTrace) add(e xtrace.Event) {
	switch e.Kind() {
	case xtrace.EventLog:
		if l := e.Log(); l.Category == hoTraceSide {
			tr.info(e.Goroutine()).side = int(l.Message[0] - '0')
		}
	case xtrace.EventRegionBegin, xtrace.EventRegionEnd:
		rg := e.Region()
		if rg.Task == xtrace.BackgroundTask {
			return
		}
		s := tr.spans[rg.Task]
		if s == nil {
			s = &hoSpan{}
			tr.spans[rg.Task] = s
			tr.order = append(tr.order, rg.Task)
		}
		switch {
		case e.Kind() == xtrace.EventRegionBegin && rg.Type == hoTraceRelease:
			s.t0, s.rel, s.began = e.Time(), e.Goroutine(), true
		case e.Kind() == xtrace.EventRegionEnd && rg.Type == hoTraceAwait:
			s.t1, s.wait = e.Time(), e.Goroutine()
		}
	case xtrace.EventStateTransition:
		st := e.StateTransition()
		if st.Resource.Kind != xtrace.ResourceGoroutine {
			return
		}
		from, to := st.Goroutine()
		g := st.Resource.Goroutine()
		t := goTrans{t: e.Time(), g: g, from: from, to: to, by: e.Goroutine()}
		gi := tr.info(g)
		switch {
		case from == xtrace.GoNotExist && to == xtrace.GoRunnable:
			gi.creator, gi.start = e.Goroutine(), firstFunc(st.Stack)
		case to == xtrace.GoSyscall:
			t.write = writes(e.Stack())
		}
		gi.trans = append(gi.trans, len(tr.trans))
		tr.trans = append(tr.trans, t)
	}
}

func firstFunc(s xtrace.Stack) string {
	for f := range s.Frames() {
		return f.Func
	}
	return ""
}

// writes reports whether a system call's stack is a write to a connection.
func writes(s xtrace.Stack) bool {
	for f := range s.Frames() {
		if strings.HasPrefix(f.Func, "internal/poll.(*FD).Write") || strings.HasPrefix(f.Func, "net.(*conn).Write") {
			return true
		}
	}
	return false
}

// sideOf is the side whose goroutine g descends from, or -1.
func (tr *goTrace) sideOf(g xtrace.GoID) int {
	for range 64 {
		gi := tr.g[g]
		if gi == nil {
			return -1
		}
		if gi.side >= 0 {
			return gi.side
		}
		g = gi.creator
	}
	return -1
}

// name is how the report calls g in hand-off s.
func (tr *goTrace) name(g xtrace.GoID, s *hoSpan) string {
	switch g {
	case s.rel:
		return "releaser"
	case s.wait:
		return "waiter"
	}
	gi := tr.g[g]
	if gi == nil || gi.start == "" {
		return fmt.Sprintf("g%d", g)
	}
	f := gi.start
	for _, p := range [][2]string{{"github.com/remutex/remutex/internal/", ""}, {"github.com/remutex/remutex", "remutex"},
		{"github.com/redis/go-redis/v9/internal/", "go-redis/"}, {"github.com/redis/go-redis/v9", "go-redis"}} {
		if strings.HasPrefix(f, p[0]) {
			f = p[1] + strings.TrimPrefix(f, p[0])
			break
		}
	}
	side := tr.sideOf(g)
	switch {
	case side == tr.sideOf(s.rel):
		return f + " [releaser's client]"
	case side == tr.sideOf(s.wait):
		return f + " [waiter's client]"
	}
	return f
}

// lastBefore returns the index of g's last transition at or before t that
// matches ok, or -1.
func (tr *goTrace) lastBefore(g xtrace.GoID, t xtrace.Time, ok func(goTrans) bool) int {
	gi := tr.g[g]
	if gi == nil {
		return -1
	}
	for i := len(gi.trans) - 1; i >= 0; i-- {
		x := tr.trans[gi.trans[i]]
		if x.t <= t && ok(x) {
			return gi.trans[i]
		}
	}
	return -1
}

func isStart(x goTrans) bool { return x.from == xtrace.GoRunnable && x.to == xtrace.GoRunning }
func isReady(x goTrans) bool { return x.to == xtrace.GoRunnable }

// handoffSwitches are one hand-off's counts.
type handoffSwitches struct {
	total, rel, wait, other, path int
	created                       int
	pathSeq, chain, started       []string
	relSeq, waitSeq               []string
	arrived                       xtrace.Time   // the network poller woke the waiter's chain
	wrote                         xtrace.Time   // the releaser's side's first write
	writes                        []xtrace.Time // all its writes
}

// count counts the switches of hand-off s. The transitions are in time
// order.
func (tr *goTrace) count(s *hoSpan) handoffSwitches {
	var c handoffSwitches
	relSide, waitSide := tr.sideOf(s.rel), tr.sideOf(s.wait)
	lo, _ := slices.BinarySearchFunc(tr.trans, s.t0, func(x goTrans, t xtrace.Time) int { return cmp.Compare(x.t, t) })
	written := false
	for _, x := range tr.trans[lo:] {
		if x.t > s.t1 {
			break
		}
		side := tr.sideOf(x.g)
		if x.write && side == relSide {
			if !written {
				written, c.wrote = true, x.t
			}
			c.writes = append(c.writes, x.t)
		}
		if x.from == xtrace.GoNotExist {
			c.created++
		}
		if !isStart(x) {
			continue
		}
		c.total++
		c.started = append(c.started, tr.name(x.g, s))
		switch side {
		case relSide:
			c.rel++
			c.relSeq = append(c.relSeq, tr.name(x.g, s))
			if !written {
				c.path++
				c.pathSeq = append(c.pathSeq, tr.name(x.g, s))
			}
		case waitSide:
			c.wait++
			c.waitSeq = append(c.waitSeq, tr.name(x.g, s))
		default:
			c.other++
		}
	}
	c.chain, c.arrived = tr.chain(s)
	return c
}

// chain is the waiter's chain of hand-off s (see the file's comment), the
// earliest first, and when the network poller woke its first goroutine (0
// if it did not).
func (tr *goTrace) chain(s *hoSpan) (seq []string, arrived xtrace.Time) {
	g, at := s.wait, s.t1
	for range 32 {
		i := tr.lastBefore(g, at, isStart)
		if i < 0 || tr.trans[i].t < s.t0 {
			break // running since before the release
		}
		seq = append(seq, tr.name(g, s))
		j := tr.lastBefore(g, tr.trans[i].t, isReady)
		if j < 0 || tr.trans[j].t < s.t0 {
			break
		}
		rd := tr.trans[j]
		if rd.from == xtrace.GoSyscall {
			seq = append(seq, "(system call returned)")
			break
		}
		if rd.by == xtrace.NoGoroutine {
			seq, arrived = append(seq, "(network poller)"), rd.t
			break
		}
		g, at = rd.by, rd.t
	}
	slices.Reverse(seq)
	return seq, arrived
}

// countSwitches reads a trace of hand-offs and counts their switches.
func countSwitches(r io.Reader) (switchResult, error) {
	tr, err := readTrace(r)
	if err != nil {
		return switchResult{}, err
	}
	var res switchResult
	var total, rel, wait, other, path, chain, created, writes []int
	var to, from, toWrite []time.Duration
	paths, chains, sides, started := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	for _, id := range tr.order {
		s := tr.spans[id]
		if !s.began || s.t1 < s.t0 {
			continue
		}
		res.Handoffs++
		c := tr.count(s)
		total, rel, wait, other = append(total, c.total), append(rel, c.rel), append(wait, c.wait), append(other, c.other)
		path, created = append(path, c.path), append(created, c.created)
		if c.wrote != 0 {
			toWrite = append(toWrite, c.wrote.Sub(s.t0))
		}
		if c.arrived != 0 {
			n := 0
			for _, t := range c.writes {
				if t < c.arrived {
					n++
				}
			}
			writes = append(writes, n)
			to, from = append(to, c.arrived.Sub(s.t0)), append(from, s.t1.Sub(c.arrived))
		}
		n := 0
		for _, g := range c.chain {
			if !strings.HasPrefix(g, "(") {
				n++
			}
		}
		chain = append(chain, n)
		paths[strings.Join(c.pathSeq, " → ")]++
		chains[strings.Join(c.chain, " → ")]++
		sides["releaser's side: "+orNone(c.relSeq)+"; waiter's side: "+orNone(c.waitSeq)]++
		seen := map[string]bool{}
		for _, g := range c.started {
			if !seen[g] {
				seen[g] = true
				started[g]++
			}
		}
	}
	if res.Handoffs == 0 {
		return res, errors.New("no hand-off in the trace")
	}
	res.Total, res.Releaser, res.Waiter, res.Other = medianInt(total), medianInt(rel), medianInt(wait), medianInt(other)
	res.Path, res.Chain, res.Created = medianInt(path), medianInt(chain), medianInt(created)
	res.ToArrival, res.FromArrival, res.ToWrite, res.Writes = median(to), median(from), median(toWrite), medianInt(writes)
	res.Paths, res.Chains, res.Sides, res.Started = byCount(paths), byCount(chains), byCount(sides), byCount(started)
	return res, nil
}

// orNone joins a sequence of goroutines.
func orNone(seq []string) string {
	if len(seq) == 0 {
		return "(none)"
	}
	return strings.Join(seq, " → ")
}

func medianInt(xs []int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return float64(s[len(s)/2])
}

// byCount lists m's sequences, the most frequent first.
func byCount(m map[string]int) []seqCount {
	var out []seqCount
	for k, n := range m {
		if k == "" {
			k = "(none)"
		}
		out = append(out, seqCount{k, n})
	}
	slices.SortFunc(out, func(a, b seqCount) int {
		if c := cmp.Compare(b.N, a.N); c != 0 {
			return c
		}
		return strings.Compare(a.Seq, b.Seq)
	})
	return out
}

// switches writes the traced phase's table.
func (w *page) switches(h *handoffResults) {
	if len(h.Switches) == 0 {
		return
	}
	w.p("### Goroutine switches per hand-off (runtime trace)\n\n")
	w.p("A short phase after the timed rounds runs each of these pairs under the runtime's tracer (runtime/trace), read back with golang.org/x/exp/trace. " +
		"Each hand-off runs from the start of the release call (t0) to the waiter's return (t1). *switches* counts goroutines put on a processor " +
		"(Runnable → Running) in [t0, t1]; a goroutine is on the releaser's or the waiter's side by the client whose side goroutine it descends from " +
		"(each client is built on its side's goroutine, so everything it starts descends from it), *other* when neither (the runtime's, timer callbacks). " +
		"*path* counts the releaser's side's switches before its first socket write after t0 (the release leaving the process); " +
		"*chain* follows from the waiter's last start back through whoever made each goroutine runnable, to the network poller's wake-up: " +
		"the switches from the message's arrival to the waiter's return; *created* counts goroutines created in [t0, t1]; " +
		"*to arrival* runs from t0 to the network poller's wake-up of the chain (the release through Redis to the message's arrival), *from arrival* from there to t1; *to the write* from t0 to the releaser's side's first socket write (the client's part); " +
		"*writes* counts the releaser's side's socket writes before the arrival (its round trips on the way). " +
		"Medians per hand-off; the time is under the tracer.\n\n")
	w.p("| variant | hand-offs | p50 µs (traced) | switches | releaser's side | path to the write | waiter's side | chain from the network | other | created | to the write µs | writes | to arrival µs | from arrival µs |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range h.Switches {
		w.p("| %s | %d | %.1f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f | %.0f | %.1f | %.1f |\n", s.Name, s.Handoffs, us(s.P50),
			s.Total, s.Releaser, s.Path, s.Waiter, s.Chain, s.Other, s.Created, us(s.ToWrite), s.Writes, us(s.ToArrival), us(s.FromArrival))
	}
	w.p("\n")
	for _, s := range h.Switches {
		w.p("%s — the waiter's chains: %s. The releaser's paths to the write: %s. The switches of each side, in order: %s. "+
			"Goroutines started in the span (in how many hand-offs): %s.\n\n",
			s.Name, seqs(s.Chains, s.Handoffs, 3), seqs(s.Paths, s.Handoffs, 3), seqs(s.Sides, s.Handoffs, 4), seqs(s.Started, s.Handoffs, 10))
	}
}

// seqs shows the first n sequences with their share of the hand-offs.
func seqs(cs []seqCount, of, n int) string {
	var parts []string
	for _, c := range cs[:min(n, len(cs))] {
		parts = append(parts, fmt.Sprintf("`%s` (%d of %d)", c.Seq, c.N, of))
	}
	return strings.Join(parts, "; ")
}
