package remutex

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Validation of the robustness test: the history the traffic records, and
// the check of it.
//
// A lock under leases is not a linearizable object (a hold ends by itself
// when its lease runs out), so the history is checked as intervals on one
// monotonic clock rather than against a sequential model (porcupine): every
// hold counts from the return of the call that took it until the first of
// its Lost closing (as a watcher goroutine saw it) and the start of its
// release. What is checked:
//
//   - Exclusion: at no time do more holds believe they hold a lock than it
//     admits: two holds of a DistMutex, a DistRWMutex writer beside any other
//     hold, more permits of a DistSemaphore than its size. That is the lease
//     claim of docs/guarantees.md: a holder that loses its lease hears of it
//     (Lost) before anybody else can take the lock. Overlaps shorter than
//     the grace are not failed but counted as near misses: the recorder's
//     own wake-ups (the Lost watcher, the worker's return) are late by
//     about that much on a loaded machine.
//   - Fences: a hold taken after another returned has a larger fence; no
//     two holds share one.
//   - Minimum hold: after a WithMinHold hold was released (not lost), no
//     other Client takes the lock before the minimum hold has passed.
//     Unless its final release failed (UnlockContext returned an error,
//     Unlock told one to the handler, or Lost closed before the release
//     returned: the lease ran out while it was on its way, and a plain
//     Unlock reports that loss no more): such a release is sent again in the
//     background, and if that does not get through while the lease runs,
//     "the lock expires on the server within its lease" (UnlockContext's
//     doc), minimum hold or not: a holder cut off from Redis cannot keep
//     anything there. (TestMinHoldKeptByAPostedRelease checks that a
//     posted release that gets through keeps the minimum hold.)
//   - Outcomes against Redis: right after an acquisition and before its
//     release the worker asks Redis through a fault-free Client (Inspect)
//     whether the hold it believes in is the one Redis has (same fence,
//     no other holder; a reader: no writer); a mismatch while its Lost
//     stays open is a violation (a differing hold count is only logged:
//     counts are absolute, and a cut-off nested call may leave Redis one
//     ahead until the next call sets it).
//     Calls that report what cannot be (ErrNotHeld or a panic for a hold
//     the goroutine has) are violations too.
//   - Liveness at the end: once faults are healed and every worker has
//     released, every lock is free again within its lease (and minimum
//     hold), and no worker is stuck in a call.
//
// Not checked: holds that were live when Redis restarted, from the restart
// on (docs/guarantees.md: holders learn of the loss at their next renewal;
// fencing is what covers that window); which waiter gets a lock (fairness);
// how late a call returns after its deadline; read holds' fences (they are
// the latest write's token, shared by design); that a semaphore's probe
// found this very acquisition (its owner token is not public): only that
// Redis has at least its permits out and has handed out its fence.

// holdMode says how a hold counts against its lock.
type holdMode int

const (
	modeExclusive holdMode = iota // a DistMutex hold, a DistRWMutex writer
	modeShared                    // a DistRWMutex reader
	modePermits                   // a DistSemaphore acquisition of permits
)

// robustHold is one hold: an acquisition that made the goroutine (or value)
// hold the lock, from the call that took it until it ended.
type robustHold struct {
	id      int
	res     string // the lock, e.g. "mutex m"
	who     string // "c1/w2": Client and worker
	client  int
	mode    holdMode
	permits int64 // modePermits
	fence   int64
	minHold time.Duration

	invoke, start time.Duration // the acquiring call's invocation and return
	// lostAt is when the watcher saw Lost closed; releaseAt when the
	// release began: -1 until then. releaseErr is why the final release
	// failed, "" if it did not. Guarded by the history's mu.
	lostAt, releaseAt time.Duration
	releaseErr        string
	// ambiguous: Lost was closed already when the hold was recorded (lost
	// at once); such a hold is not checked.
	ambiguous bool
	// ignoreLost: a fake holder that does not watch Lost (the checker's
	// own test): it believes it holds until it releases.
	ignoreLost bool
}

func (h *robustHold) String() string {
	s := fmt.Sprintf("hold#%d %s %s fence=%d [%s", h.id, h.who, h.res, h.fence, fmtAt(h.start))
	if h.mode == modePermits {
		s = fmt.Sprintf("hold#%d %s %s permits=%d fence=%d [%s", h.id, h.who, h.res, h.permits, h.fence, fmtAt(h.start))
	} else if h.mode == modeShared {
		s = fmt.Sprintf("hold#%d %s %s (read) [%s", h.id, h.who, h.res, fmtAt(h.start))
	}
	switch {
	case h.lostAt >= 0 && (h.releaseAt < 0 || h.lostAt < h.releaseAt):
		s += ", lost " + fmtAt(h.lostAt)
	case h.releaseAt >= 0 && h.releaseErr != "":
		s += ", released " + fmtAt(h.releaseAt) + " (failed)"
	case h.releaseAt >= 0:
		s += ", released " + fmtAt(h.releaseAt)
	default:
		s += ", open"
	}
	return s + ")"
}

// end is when the hold stopped believing it held, or limit.
func (h *robustHold) end(limit time.Duration) time.Duration {
	e := limit
	if h.lostAt >= 0 && !h.ignoreLost {
		e = min(e, h.lostAt)
	}
	if h.releaseAt >= 0 {
		e = min(e, h.releaseAt)
	}
	return max(e, h.start)
}

// robustEvent is one line of the history: a call's invocation or return, a
// fault, a loss seen, a probe.
type robustEvent struct {
	at   time.Duration
	who  string
	what string
}

// robustProbe is a disagreement between a hold and what Redis held.
type robustProbe struct {
	at   time.Duration
	hold *robustHold
	msg  string
	near bool // Lost closed within the grace after the read
}

// robustHistory is what a run did, on one monotonic clock.
type robustHistory struct {
	base time.Time

	mu       sync.Mutex
	events   []robustEvent
	holds    []*robustHold
	probes   []robustProbe
	restarts []time.Duration // when Redis was killed
	bad      []robustViolation
}

func newRobustHistory() *robustHistory { return &robustHistory{base: time.Now()} }

func (h *robustHistory) now() time.Duration { return time.Since(h.base) }

func fmtAt(d time.Duration) string { return fmt.Sprintf("+%.6fs", d.Seconds()) }

// log appends an event at now.
func (h *robustHistory) log(who, format string, args ...any) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := h.now()
	h.events = append(h.events, robustEvent{at: at, who: who, what: fmt.Sprintf(format, args...)})
	return at
}

// addHold records a hold that its call's return (at start) reported.
func (h *robustHistory) addHold(hd *robustHold) *robustHold {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.id = len(h.holds) + 1
	hd.lostAt, hd.releaseAt = -1, -1
	h.holds = append(h.holds, hd)
	return hd
}

// lost records that hd's Lost was seen closed now (or at at, if at >= 0).
func (h *robustHistory) lost(hd *robustHold, at time.Duration) {
	h.mu.Lock()
	if at < 0 {
		at = h.now()
	}
	if hd.lostAt < 0 {
		hd.lostAt = at
	}
	h.mu.Unlock()
	h.log(hd.who, "Lost closed: %v", hd)
}

// releasing records that hd's release begins now.
func (h *robustHistory) releasing(hd *robustHold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.releaseAt < 0 {
		hd.releaseAt = h.now()
	}
}

// releaseFailed records that hd's final release failed, and why.
func (h *robustHistory) releaseFailed(hd *robustHold, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.releaseErr = why
}

// watch records when lost closes, until the returned function stops it;
// that function waits for the watcher to exit.
func (h *robustHistory) watch(hd *robustHold, lost <-chan struct{}) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-lost:
			h.lost(hd, -1)
		case <-quit:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// restarted records a Redis restart (the kill) now.
func (h *robustHistory) restarted() {
	at := h.log("nemesis", "redis-server killed")
	h.mu.Lock()
	h.restarts = append(h.restarts, at)
	h.mu.Unlock()
}

// violation records something wrong seen while the run went on.
func (h *robustHistory) violation(kind, who, format string, args ...any) {
	at := h.log(who, "VIOLATION %s: "+format, append([]any{kind}, args...)...)
	h.mu.Lock()
	h.bad = append(h.bad, robustViolation{at: at, kind: kind, msg: who + ": " + fmt.Sprintf(format, args...)})
	h.mu.Unlock()
}

// probe records a disagreement between a hold and Redis.
func (h *robustHistory) probe(p robustProbe) {
	h.log(p.hold.who, "probe: %s (near miss: %v): %v", p.msg, p.near, p.hold)
	h.mu.Lock()
	h.probes = append(h.probes, p)
	h.mu.Unlock()
}

// robustViolation is one thing wrong with a history.
type robustViolation struct {
	at    time.Duration // when it happened (began)
	kind  string
	msg   string
	holds []*robustHold
}

func (v robustViolation) String() string {
	s := fmt.Sprintf("%s %s: %s", fmtAt(v.at), v.kind, v.msg)
	for _, h := range v.holds {
		s += "\n\t\t" + h.String()
	}
	return s
}

// robustLimits says what each lock admits and how the check is tuned.
type robustLimits struct {
	size  map[string]int64 // a semaphore's permits, by resource
	grace time.Duration    // overlaps up to this long are near misses
	end   time.Duration    // end of the run: open holds count until it
}

// check validates the history (see the top of this file). It returns the
// violations and the near misses, each in time order.
func (h *robustHistory) check(lim robustLimits) (bad, near []robustViolation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	bad = append(bad, h.bad...)
	byRes := map[string][]*robustHold{}
	var names []string
	for _, hd := range h.holds {
		if hd.ambiguous {
			continue
		}
		if byRes[hd.res] == nil {
			names = append(names, hd.res)
		}
		byRes[hd.res] = append(byRes[hd.res], hd)
	}
	slices.Sort(names)
	for _, res := range names {
		holds := byRes[res]
		b, n := h.checkExclusion(holds, lim.size[res], lim)
		bad, near = append(bad, b...), append(near, n...)
		bad = append(bad, checkFences(holds)...)
		bad = append(bad, h.checkMinHold(holds, lim)...)
	}
	for _, p := range h.probes {
		if h.restartBetween(p.hold.invoke, p.at) {
			continue
		}
		v := robustViolation{at: p.at, kind: "outcome disagrees with Redis", msg: p.msg, holds: []*robustHold{p.hold}}
		if p.near {
			near = append(near, v)
		} else {
			bad = append(bad, v)
		}
	}
	order := func(a, b robustViolation) int { return cmp.Compare(a.at, b.at) }
	slices.SortStableFunc(bad, order)
	slices.SortStableFunc(near, order)
	return bad, near
}

// restartBetween reports a Redis restart in [from, to].
func (h *robustHistory) restartBetween(from, to time.Duration) bool {
	for _, r := range h.restarts {
		if r >= from && r <= to {
			return true
		}
	}
	return false
}

// checked returns the interval in which hd counts: truncated at a restart
// it was live across (the documented exception).
func (h *robustHistory) checked(hd *robustHold, limit time.Duration) (from, to time.Duration) {
	from, to = hd.start, hd.end(limit)
	for _, r := range h.restarts {
		if r > from && r < to {
			to = r
		}
	}
	return from, to
}

// conflict reports whether the holds in active exceed what the lock admits.
func conflict(active map[*robustHold]bool, size int64) bool {
	var n, permits int64
	writer := false
	for hd := range active {
		n++
		permits += hd.permits
		if hd.mode == modeExclusive {
			writer = true
		}
	}
	if size > 0 {
		return permits > size
	}
	return writer && n > 1
}

// checkExclusion sweeps the holds of one lock in time order and reports
// every stretch in which they exceed what it admits: longer than the grace
// a violation, else a near miss.
func (h *robustHistory) checkExclusion(holds []*robustHold, size int64, lim robustLimits) (bad, near []robustViolation) {
	type edge struct {
		at    time.Duration
		open  bool
		holds *robustHold
	}
	var edges []edge
	for _, hd := range holds {
		from, to := h.checked(hd, lim.end)
		if to <= from {
			continue
		}
		edges = append(edges, edge{from, true, hd}, edge{to, false, hd})
	}
	slices.SortStableFunc(edges, func(a, b edge) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		if a.open == b.open {
			return 0
		}
		if !a.open {
			return -1 // half-open intervals: ends first
		}
		return 1
	})
	active := map[*robustHold]bool{}
	var since time.Duration
	var involved map[*robustHold]bool
	for _, e := range edges {
		was := involved != nil
		if e.open {
			active[e.holds] = true
		} else {
			delete(active, e.holds)
		}
		now := conflict(active, size)
		switch {
		case now && !was:
			since, involved = e.at, map[*robustHold]bool{}
			fallthrough
		case now:
			for hd := range active {
				involved[hd] = true
			}
		case was:
			v := robustViolation{at: since, kind: "overlap", holds: sortedHolds(involved)}
			v.msg = fmt.Sprintf("%d holds of %s believed they held it at once for %v", len(involved), v.holds[0].res, e.at-since)
			if e.at-since > lim.grace {
				bad = append(bad, v)
			} else {
				near = append(near, v)
			}
			involved = nil
		}
	}
	return bad, near
}

func sortedHolds(set map[*robustHold]bool) []*robustHold {
	var hs []*robustHold
	for hd := range set {
		hs = append(hs, hd)
	}
	slices.SortFunc(hs, func(a, b *robustHold) int { return cmp.Compare(a.id, b.id) })
	return hs
}

// checkFences reports holds whose fence is not above that of every hold
// that had been taken before their call began, and fences given twice.
func checkFences(holds []*robustHold) (bad []robustViolation) {
	var fenced []*robustHold
	seen := map[int64]*robustHold{}
	for _, hd := range holds {
		if hd.mode == modeShared || hd.fence == 0 {
			continue
		}
		if o := seen[hd.fence]; o != nil {
			bad = append(bad, robustViolation{at: hd.start, kind: "shared fence", holds: []*robustHold{o, hd},
				msg: fmt.Sprintf("two holds of %s got fence %d", hd.res, hd.fence)})
		}
		seen[hd.fence] = hd
		fenced = append(fenced, hd)
	}
	byStart := slices.Clone(fenced)
	slices.SortFunc(byStart, func(a, b *robustHold) int { return cmp.Compare(a.start, b.start) })
	byInvoke := slices.Clone(fenced)
	slices.SortFunc(byInvoke, func(a, b *robustHold) int { return cmp.Compare(a.invoke, b.invoke) })
	var top *robustHold // highest fence among the holds taken before the current call
	i := 0
	for _, hd := range byInvoke {
		for ; i < len(byStart) && byStart[i].start < hd.invoke; i++ {
			if top == nil || byStart[i].fence > top.fence {
				top = byStart[i]
			}
		}
		if top != nil && hd.fence <= top.fence && top != hd {
			bad = append(bad, robustViolation{at: hd.start, kind: "fence went back", holds: []*robustHold{top, hd},
				msg: fmt.Sprintf("a hold of %s taken after another returned got fence %d, not above %d", hd.res, hd.fence, top.fence)})
		}
	}
	return bad
}

// checkMinHold reports holds of another Client taken before a released
// WithMinHold hold's minimum hold had passed.
func (h *robustHistory) checkMinHold(holds []*robustHold, lim robustLimits) (bad []robustViolation) {
	for _, a := range holds {
		if a.minHold == 0 || a.releaseAt < 0 || a.lostAt >= 0 && a.lostAt <= a.releaseAt || a.releaseErr != "" {
			continue
		}
		until := a.start + a.minHold - lim.grace
		for _, b := range holds {
			if b.client == a.client || b.start < a.releaseAt || b.start >= until || h.restartBetween(a.invoke, b.start) {
				continue
			}
			bad = append(bad, robustViolation{at: b.start, kind: "minimum hold not kept", holds: []*robustHold{a, b},
				msg: fmt.Sprintf("%s was taken %v after a hold with WithMinHold(%v) was acquired", a.res, b.start-a.start, a.minHold)})
		}
	}
	return bad
}

// timeline returns the events from..to in time order, one a line: those of
// the named actors (and every violation), or all for who nil.
func (h *robustHistory) timeline(from, to time.Duration, who map[string]bool) string {
	h.mu.Lock()
	evs := slices.Clone(h.events)
	h.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b robustEvent) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	for _, e := range evs {
		if e.at >= from && e.at <= to && (who == nil || who[e.who] || strings.HasPrefix(e.what, "VIOLATION")) {
			fmt.Fprintf(&b, "%s %-8s %s\n", fmtAt(e.at), e.who, e.what)
		}
	}
	return b.String()
}

func TestRobustChecker(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// hold: res, client, mode, permits, fence; invoke, start, lost,
	// released in ms (-1: never).
	hold := func(res string, client int, mode holdMode, permits, fence int64, invoke, start, lost, released int) *robustHold {
		lt, rt := ms(lost), ms(released)
		if lost < 0 {
			lt = -1
		}
		if released < 0 {
			rt = -1
		}
		return &robustHold{res: res, who: fmt.Sprintf("c%d/w1", client), client: client, mode: mode, permits: permits,
			fence: fence, invoke: ms(invoke), start: ms(start), lostAt: lt, releaseAt: rt}
	}
	const m, rw, sem = "mutex m", "rwmutex rw", "semaphore sem"
	ex, sh, pm := modeExclusive, modeShared, modePermits
	ignoring := func(h *robustHold) *robustHold { h.ignoreLost = true; return h }
	minHold := func(h *robustHold, d int) *robustHold { h.minHold = ms(d); return h }
	failed := func(h *robustHold) *robustHold { h.releaseErr = "context deadline exceeded"; return h }
	tests := []struct {
		name      string
		holds     []*robustHold
		restarts  []int
		probes    []robustProbe
		bad, near []string // kinds
	}{
		{name: "one after the other", holds: []*robustHold{
			hold(m, 1, ex, 0, 1, 0, 1, -1, 100), hold(m, 2, ex, 0, 2, 50, 100, -1, 200)}},
		{name: "second taken while the first believes it holds", holds: []*robustHold{
			hold(m, 1, ex, 0, 1, 0, 1, -1, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			bad: []string{"overlap"}},
		{name: "first lost before the second took it", holds: []*robustHold{
			hold(m, 1, ex, 0, 1, 0, 1, 90, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)}},
		{name: "first lost just after: within the grace", holds: []*robustHold{
			hold(m, 1, ex, 0, 1, 0, 1, 105, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			near: []string{"overlap"}},
		{name: "a holder that ignores Lost", holds: []*robustHold{
			ignoring(hold(m, 1, ex, 0, 1, 0, 1, 90, 200)), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			bad: []string{"overlap"}},
		{name: "a hold live across a Redis restart", holds: []*robustHold{
			hold(m, 1, ex, 0, 1, 0, 1, 150, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)}, restarts: []int{60}},
		{name: "readers share", holds: []*robustHold{
			hold(rw, 1, sh, 0, 0, 0, 1, -1, 200), hold(rw, 2, sh, 0, 0, 50, 100, -1, 300)}},
		{name: "writer beside a reader", holds: []*robustHold{
			hold(rw, 1, sh, 0, 0, 0, 1, -1, 200), hold(rw, 2, ex, 0, 5, 50, 100, -1, 300)},
			bad: []string{"overlap"}},
		{name: "permits within the size", holds: []*robustHold{
			hold(sem, 1, pm, 2, 1, 0, 1, -1, 200), hold(sem, 2, pm, 1, 2, 50, 100, -1, 300)}},
		{name: "permits beyond the size", holds: []*robustHold{
			hold(sem, 1, pm, 2, 1, 0, 1, -1, 200), hold(sem, 2, pm, 1, 2, 50, 100, -1, 300),
			hold(sem, 3, pm, 1, 3, 50, 150, -1, 190)},
			bad: []string{"overlap"}},
		{name: "fence went back", holds: []*robustHold{
			hold(m, 1, ex, 0, 10, 0, 1, -1, 50), hold(m, 2, ex, 0, 9, 60, 70, -1, 80)},
			bad: []string{"fence went back"}},
		{name: "concurrent calls may return fences in either order", holds: []*robustHold{
			hold(m, 1, ex, 0, 10, 0, 100, -1, 150), hold(m, 2, ex, 0, 9, 0, 20, -1, 50)}},
		{name: "fence given twice", holds: []*robustHold{
			hold(m, 1, ex, 0, 7, 0, 1, -1, 50), hold(m, 2, ex, 0, 7, 0, 60, -1, 80)},
			bad: []string{"shared fence"}},
		{name: "minimum hold not kept", holds: []*robustHold{
			minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300), hold(m, 2, ex, 0, 2, 10, 100, -1, 150)},
			bad: []string{"minimum hold not kept"}},
		{name: "minimum hold of a release that failed", holds: []*robustHold{
			failed(minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300)), hold(m, 2, ex, 0, 2, 10, 100, -1, 150)}},
		{name: "minimum hold kept", holds: []*robustHold{
			minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300), hold(m, 2, ex, 0, 2, 10, 301, -1, 350)}},
		{name: "a probe that found another hold", holds: []*robustHold{hold(m, 1, ex, 0, 1, 0, 1, -1, 50)},
			probes: []robustProbe{{at: ms(5), msg: "no holder"}}, bad: []string{"outcome disagrees with Redis"}},
		{name: "a probe after a Redis restart", holds: []*robustHold{hold(m, 1, ex, 0, 1, 0, 1, -1, 50)},
			probes: []robustProbe{{at: ms(5), msg: "no holder"}}, restarts: []int{3}},
	}
	kinds := func(vs []robustViolation) []string {
		var ks []string
		for _, v := range vs {
			ks = append(ks, v.kind)
		}
		slices.Sort(ks)
		return ks
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newRobustHistory()
			for i, hd := range tt.holds {
				hd.id = i + 1
				h.holds = append(h.holds, hd)
			}
			for _, r := range tt.restarts {
				h.restarts = append(h.restarts, ms(r))
			}
			for _, p := range tt.probes {
				p.hold = tt.holds[0]
				h.probes = append(h.probes, p)
			}
			bad, near := h.check(robustLimits{size: map[string]int64{sem: 3}, grace: ms(10), end: ms(1000)})
			want := slices.Clone(tt.bad)
			slices.Sort(want)
			if got := kinds(bad); !slices.Equal(got, want) {
				t.Errorf("violations: got %v, want %v; %v", got, want, bad)
			}
			if got := kinds(near); !slices.Equal(got, tt.near) {
				t.Errorf("near misses: got %v, want %v; %v", got, tt.near, near)
			}
		})
	}
}

// robustSection is how long the second holder of
// TestRobustCheckerCatchesIgnoredLost holds: longer than the grace, so that
// an overlap is a violation.
const robustSection = 100 * time.Millisecond

// TestRobustCheckerCatchesIgnoredLost runs the checker on a real history:
// a holder is cut off until its lease runs out and another Client takes the
// lock. Recorded honestly (its Lost watched), that is no violation; by a
// fake holder that ignores Lost, it is an overlap.
func TestRobustCheckerCatchesIgnoredLost(t *testing.T) {
	for _, ignore := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoreLost=%v", ignore), func(t *testing.T) {
			env := newRobustEnv(t, 1, 2, 1)
			a := newRobustWorker(env, env.clients[0], 1, 1)
			b := newRobustWorker(env, env.clients[1], 1, 1)
			la, lb := env.clients[0].m[0], env.clients[1].m[0]
			la.ignoreLost = ignore
			invoke, ret, err := a.call("m.A.Lock()", func() error { la.lock(); return nil })
			if err != nil {
				t.Fatal(err)
			}
			a.took(la, "m.A.Lock()", invoke, ret, la.lost(), la.fence(), 0)
			lost := la.lost()
			env.links[0].proxy.Pause() // a is cut off: its lease runs out
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			invoke, ret, err = b.call("m.A.LockContext(10s)", func() error { return lb.lockCtx(ctx) })
			if err != nil {
				t.Fatalf("b's LockContext: %v", err)
			}
			b.took(lb, "m.A.LockContext(10s)", invoke, ret, lb.lost(), lb.fence(), 0)
			<-lost // (a's Lost is closed by now: b holds)
			time.Sleep(robustSection)
			env.links[0].proxy.Resume()
			a.release(la)
			b.release(lb)
			bad, _ := env.hist.check(robustLimits{grace: env.grace, end: env.hist.now()})
			var overlaps []robustViolation
			for _, v := range bad {
				if v.kind == "overlap" {
					overlaps = append(overlaps, v)
				}
			}
			if ignore && len(overlaps) != 1 {
				t.Errorf("got %d overlaps, want 1: the fake holder ignored Lost\n%s", len(overlaps), env.hist.timeline(0, time.Hour, nil))
			}
			if !ignore && len(overlaps) != 0 {
				t.Errorf("got overlaps %v, want none: a holds until its Lost closed\n%s", overlaps, env.hist.timeline(0, time.Hour, nil))
			}
		})
	}
}
