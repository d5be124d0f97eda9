package lockcheck

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// The kinds of violations.
const (
	KindOverlap     = "overlap"
	KindSharedFence = "shared fence"
	KindFenceBack   = "fence went back"
	KindMinHold     = "minimum hold not kept"
	KindProbe       = "outcome disagrees with Redis"
	KindLate        = "call returned late"
	KindRefused     = "register refused a hold not lost"
	KindRegister    = "register"
)

// Violation is one thing wrong with a history.
type Violation struct {
	At    time.Duration // when it happened (began)
	Kind  string
	Msg   string
	Holds []*Hold
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s %s: %s", At(v.At), v.Kind, v.Msg)
	for _, hd := range v.Holds {
		s += "\n\t\t" + hd.String()
	}
	return s
}

// Limits says what each lock admits and how the checks are tuned.
type Limits struct {
	Size map[string]int64 // a semaphore's permits, by Res
	// Grace: overlaps up to this long are near misses (the recorder's own
	// lateness).
	Grace time.Duration
	// LostSlack: a hold stops counting this long before its Lost was seen
	// closed, and a refused write is excused if Lost closed within it.
	LostSlack time.Duration
	// End is the end of the run: open holds count until it (0: forever).
	End time.Duration
	// FencesByReturn: a hold's fence must exceed every fence returned
	// before it returned (exclusive locks); else before its call began.
	FencesByReturn bool
	// Late: a call that returned more than this past its deadline is a
	// violation (0: not checked).
	Late time.Duration
}

// Check validates the history (see the package doc). It returns the
// violations, with those recorded while the run went, and the near misses,
// each in time order.
func (h *History) Check(lim Limits) (bad, near []Violation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim.End == 0 {
		lim.End = math.MaxInt64 / 2
	}
	bad = append(bad, h.bad...)
	byRes := map[string][]*Hold{}
	var names []string
	for _, hd := range h.holds {
		bad = append(bad, checkLate(hd, lim.Late)...)
		if hd.Ambiguous || !hd.Held() {
			continue
		}
		bad = append(bad, checkWrites(hd, lim.LostSlack)...)
		if byRes[hd.Res] == nil {
			names = append(names, hd.Res)
		}
		byRes[hd.Res] = append(byRes[hd.Res], hd)
	}
	slices.Sort(names)
	for _, res := range names {
		holds := byRes[res]
		b, n := h.checkOverlap(holds, lim.Size[res], lim)
		bad, near = append(bad, b...), append(near, n...)
		bad = append(bad, checkFences(holds, lim.FencesByReturn)...)
		bad = append(bad, h.checkMinHold(holds, lim)...)
	}
	for _, p := range h.probes {
		if h.restartBetween(p.Hold.Invoke, p.At) {
			continue
		}
		v := Violation{At: p.At, Kind: KindProbe, Msg: p.Msg, Holds: []*Hold{p.Hold}}
		if p.Near {
			near = append(near, v)
		} else {
			bad = append(bad, v)
		}
	}
	order := func(a, b Violation) int { return cmp.Compare(a.At, b.At) }
	slices.SortStableFunc(bad, order)
	slices.SortStableFunc(near, order)
	return bad, near
}

// restartBetween reports a Redis restart in [from, to].
func (h *History) restartBetween(from, to time.Duration) bool {
	for _, r := range h.restarts {
		if r >= from && r <= to {
			return true
		}
	}
	return false
}

// checked returns the interval in which hd counts: from its return until
// its release or LostSlack before its Lost, truncated at a restart it was
// live across (the documented exception). It is never empty: a hold taken
// while others held is found even if it was lost at once.
func (h *History) checked(hd *Hold, lim Limits) (from, to time.Duration) {
	from, to = hd.Start, lim.End
	if hd.LostAt != None && !hd.IgnoreLost {
		to = min(to, hd.LostAt-lim.LostSlack)
	}
	if hd.ReleaseAt != None {
		to = min(to, hd.ReleaseAt)
	}
	to = max(to, from+1)
	for _, r := range h.restarts {
		if r > from && r < to {
			to = r
		}
	}
	return from, to
}

// conflict reports whether the holds in active exceed what the lock admits.
func conflict(active map[*Hold]bool, size int64) bool {
	var n, permits int64
	writer := false
	for hd := range active {
		n++
		permits += hd.Permits
		if hd.Mode == Exclusive {
			writer = true
		}
	}
	if size > 0 {
		return permits > size
	}
	return writer && n > 1
}

// checkOverlap sweeps the holds of one lock in time order and reports
// every stretch in which they exceed what it admits (size: a semaphore's
// permits, else 0): longer than the grace a violation, else a near miss.
func (h *History) checkOverlap(holds []*Hold, size int64, lim Limits) (bad, near []Violation) {
	type edge struct {
		at   time.Duration
		open bool
		hold *Hold
	}
	var edges []edge
	for _, hd := range holds {
		from, to := h.checked(hd, lim)
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
	active := map[*Hold]bool{}
	var since time.Duration
	var involved map[*Hold]bool
	for _, e := range edges {
		was := involved != nil
		if e.open {
			active[e.hold] = true
		} else {
			delete(active, e.hold)
		}
		now := conflict(active, size)
		switch {
		case now && !was:
			since, involved = e.at, map[*Hold]bool{}
			fallthrough
		case now:
			for hd := range active {
				involved[hd] = true
			}
		case was:
			v := Violation{At: since, Kind: KindOverlap, Holds: sortedHolds(involved)}
			v.Msg = fmt.Sprintf("%d holds of %s believed they held it at once for %v", len(involved), v.Holds[0].Res, e.at-since)
			if e.at-since > lim.Grace {
				bad = append(bad, v)
			} else {
				near = append(near, v)
			}
			involved = nil
		}
	}
	return bad, near
}

func sortedHolds(set map[*Hold]bool) []*Hold {
	var hs []*Hold
	for hd := range set {
		hs = append(hs, hd)
	}
	slices.SortFunc(hs, func(a, b *Hold) int { return cmp.Compare(a.ID, b.ID) })
	return hs
}

// checkFences reports fences given twice, and holds whose fence is not
// above that of every hold that returned before their call began (or, by
// return, before they returned). Read holds and unfenced ones are left out.
func checkFences(holds []*Hold, byReturn bool) (bad []Violation) {
	var fenced []*Hold
	seen := map[int64]*Hold{}
	for _, hd := range holds {
		if hd.Mode == Shared || hd.Fence == 0 {
			continue
		}
		if o := seen[hd.Fence]; o != nil {
			bad = append(bad, Violation{At: hd.Start, Kind: KindSharedFence, Holds: []*Hold{o, hd},
				Msg: fmt.Sprintf("two holds of %s got fence %d", hd.Res, hd.Fence)})
		}
		seen[hd.Fence] = hd
		fenced = append(fenced, hd)
	}
	begun := func(hd *Hold) time.Duration { return hd.Invoke }
	if byReturn {
		begun = func(hd *Hold) time.Duration { return hd.Start }
	}
	byStart := slices.Clone(fenced)
	slices.SortFunc(byStart, func(a, b *Hold) int { return cmp.Compare(a.Start, b.Start) })
	byBegun := slices.Clone(fenced)
	slices.SortFunc(byBegun, func(a, b *Hold) int { return cmp.Compare(begun(a), begun(b)) })
	var top *Hold // the highest fence among the holds returned before the current one began
	i := 0
	for _, hd := range byBegun {
		for ; i < len(byStart) && byStart[i].Start < begun(hd); i++ {
			if top == nil || byStart[i].Fence > top.Fence {
				top = byStart[i]
			}
		}
		if top != nil && hd.Fence <= top.Fence && top != hd {
			bad = append(bad, Violation{At: hd.Start, Kind: KindFenceBack, Holds: []*Hold{top, hd},
				Msg: fmt.Sprintf("a hold of %s taken after another returned got fence %d, not above %d", hd.Res, hd.Fence, top.Fence)})
		}
	}
	return bad
}

// checkMinHold reports holds of another Client taken before a released
// WithMinHold hold's minimum hold had passed.
func (h *History) checkMinHold(holds []*Hold, lim Limits) (bad []Violation) {
	for _, a := range holds {
		if a.MinHold == 0 || a.ReleaseAt == None || a.lostBy(a.ReleaseAt) || a.ReleaseErr != "" {
			continue
		}
		until := a.Start + a.MinHold - lim.Grace
		for _, b := range holds {
			if b.Client == a.Client || b.Start < a.ReleaseAt || b.Start >= until || h.restartBetween(a.Invoke, b.Start) {
				continue
			}
			bad = append(bad, Violation{At: b.Start, Kind: KindMinHold, Holds: []*Hold{a, b},
				Msg: fmt.Sprintf("%s was taken %v after a hold with WithMinHold(%v) was acquired", a.Res, b.Start-a.Start, a.MinHold)})
		}
	}
	return bad
}

// checkLate reports a lock or release call of hd that returned more than
// late past its deadline (late 0: none).
func checkLate(hd *Hold, late time.Duration) (bad []Violation) {
	if late <= 0 {
		return nil
	}
	if hd.Deadline != None && hd.Start-hd.Deadline > late {
		bad = append(bad, Violation{At: hd.Start, Kind: KindLate, Holds: []*Hold{hd},
			Msg: fmt.Sprintf("%s: lock returned %v past its deadline", hd.Who, hd.Start-hd.Deadline)})
	}
	if hd.ReleaseRet != None && hd.ReleaseDeadline != None && hd.ReleaseRet-hd.ReleaseDeadline > late {
		bad = append(bad, Violation{At: hd.ReleaseRet, Kind: KindLate, Holds: []*Hold{hd},
			Msg: fmt.Sprintf("%s: unlock returned %v past its deadline", hd.Who, hd.ReleaseRet-hd.ReleaseDeadline)})
	}
	return bad
}

// checkWrites reports hd's register writes that were refused while its Lost
// had not closed (slack after the reply), or that failed.
func checkWrites(hd *Hold, slack time.Duration) (bad []Violation) {
	for _, w := range hd.Writes {
		switch {
		case w.Res == "0" && !hd.lostBy(w.Ret+slack):
			lost := "never closed"
			if hd.LostAt != None {
				lost = "closed at " + At(hd.LostAt)
			}
			bad = append(bad, Violation{At: w.Ret, Kind: KindRefused, Holds: []*Hold{hd},
				Msg: fmt.Sprintf("%s: %s with fence %d refused, Lost %s", hd.Who, w.Op, hd.Fence, lost)})
		case w.Res != "0" && w.Res != "1":
			bad = append(bad, Violation{At: w.Ret, Kind: KindRegister, Holds: []*Hold{hd},
				Msg: fmt.Sprintf("%s: %s: %s", hd.Who, w.Op, w.Res)})
		}
	}
	return bad
}

// CheckRegister reports what the fenced register's log shows wrong
// (redistest.Register.Anomalies): overlapping writes, a shared fence, a
// fence that went back; for a semaphore's register (permits > 0, its
// holders write with fence 0), more writers at once than its permits.
// Refused writes are left to Check, which holds them against the holds'
// Lost.
func (h *History) CheckRegister(accepted []redistest.Write, found []redistest.Anomaly, permits int) (bad []Violation) {
	at := func(us int64) time.Duration { return h.Rel(time.UnixMicro(us)) }
	if permits > 0 {
		for _, c := range redistest.Crowds(accepted, permits) {
			bad = append(bad, Violation{At: at(c[len(c)-1].Start), Kind: KindRegister,
				Msg: fmt.Sprintf("%d writers at once, want at most %d: %v", len(c), permits, c)})
		}
		return bad
	}
	for _, a := range found {
		if a.Kind == redistest.Refused {
			continue
		}
		bad = append(bad, Violation{At: at(a.B.End), Kind: KindRegister, Msg: a.String()})
	}
	return bad
}
