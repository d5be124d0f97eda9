package lockcheck

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// The checks of an election (DistElection): its terms are holds (Mode
// Exclusive, Fence the term, Values what the term published), so Check
// finds two leaders at once and terms that went back, and CheckRegister
// the leaders' fenced writes out of order. What is the election's own: what
// its observers saw (CheckObserved), and a leader after every heal
// (CheckLeading).

// The kinds of violations of an election.
const (
	KindObservedBack   = "observed term went back"
	KindObservedAgain  = "observed a term again unchanged"
	KindObservedWrong  = "observed a value with another term"
	KindObservedMissed = "observer skipped a term"
	KindLeaderless     = "no leader after a heal"
)

// Observation is one leader that an observer of an election (Observe)
// received: its term and value.
type Observation struct {
	At    time.Duration // when the observer received it
	Who   string        // the observer
	Res   string        // the election, as its holds name it
	Term  int64
	Value string
}

func (o Observation) String() string {
	return fmt.Sprintf("%s saw term %d value %s at %s", o.Who, o.Term, o.Value, At(o.At))
}

// Observed records o; each observer's observations are checked in the
// order they were recorded, which must be the order it received them.
func (h *History) Observed(o Observation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observed = append(h.observed, o)
}

// Observations returns how many leaders each observer received.
func (h *History) Observations() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, o := range h.observed {
		n[o.Who]++
	}
	return n
}

// LastObserved returns the highest term the observer who received (0 if
// none).
func (h *History) LastObserved(who string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var top int64
	for _, o := range h.observed {
		if o.Who == who {
			top = max(top, o.Term)
		}
	}
	return top
}

// CheckObserved checks what each observer of an election received, in
// order, against the terms (the holds of its Res):
//
//   - back: a term below one it received before;
//   - again: the term it received last, with the value it had (a term
//     comes again only with a changed value, a Proclaim);
//   - wrong: a value that a term published (Hold.Values) received with
//     another term; but a Campaign's value (the first) may come with an
//     earlier term too: the Campaign's own, lost before it returned (it
//     published, the reply was lost, and the term with it; it campaigned
//     again);
//   - skipped: a term that was held and published, whose Campaign began
//     after the observer's first observation (so after it listened), and
//     that it never received although it received a later one. (That it
//     received the latest term at all is the caller's to check: it
//     depends on when the run ends.)
func (h *History) CheckObserved() (bad []Violation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	byValue := map[string]*Hold{} // the held terms, by what they published
	termsOf := map[string][]*Hold{}
	for _, hd := range h.holds {
		if !hd.Held() || hd.Ambiguous {
			continue
		}
		for _, v := range hd.Values {
			byValue[hd.Res+"\x00"+v] = hd
		}
		if len(hd.Values) > 0 {
			termsOf[hd.Res] = append(termsOf[hd.Res], hd)
		}
	}
	type key struct{ who, res string }
	var order []key
	seen := map[key][]Observation{}
	for _, o := range h.observed {
		k := key{o.Who, o.Res}
		if seen[k] == nil {
			order = append(order, k)
		}
		seen[k] = append(seen[k], o)
	}
	for _, k := range order {
		obs := seen[k]
		got := map[int64]bool{}
		var top Observation
		for i, o := range obs {
			got[o.Term] = true
			if hd := byValue[o.Res+"\x00"+o.Value]; hd != nil && wrongTerm(hd, o) {
				bad = append(bad, Violation{At: o.At, Kind: KindObservedWrong, Holds: []*Hold{hd},
					Msg: fmt.Sprintf("%v, but the value was published in term %d", o, hd.Fence)})
			}
			if i == 0 {
				top = o
				continue
			}
			prev := obs[i-1]
			switch {
			case o.Term < top.Term:
				bad = append(bad, Violation{At: o.At, Kind: KindObservedBack,
					Msg: fmt.Sprintf("%v after term %d", o, top.Term)})
			case o.Term == prev.Term && o.Value == prev.Value:
				bad = append(bad, Violation{At: o.At, Kind: KindObservedAgain,
					Msg: fmt.Sprintf("%v, as it did at %s", o, At(prev.At))})
			}
			if o.Term > top.Term {
				top = o
			}
		}
		for _, hd := range termsOf[k.res] {
			if hd.Invoke > obs[0].At && hd.Fence < top.Term && !got[hd.Fence] {
				bad = append(bad, Violation{At: hd.Start, Kind: KindObservedMissed, Holds: []*Hold{hd},
					Msg: fmt.Sprintf("%s never saw term %d (elected at %s) but saw term %d", k.who, hd.Fence, At(hd.Start), top.Term)})
			}
		}
	}
	slices.SortStableFunc(bad, func(a, b Violation) int { return cmp.Compare(a.At, b.At) })
	return bad
}

// wrongTerm reports whether o's value cannot have been published with o's
// term: only hd's term publishes its values, but its first (Campaign's) may
// have been published by an earlier term of the same Campaign call.
func wrongTerm(hd *Hold, o Observation) bool {
	return o.Term > hd.Fence || o.Term < hd.Fence && o.Value != hd.Values[0]
}

// CheckLeading reports each heal after which no hold of res (a term of an
// election) was believed held within back: at some time in [heal, heal +
// back] a hold counts, as Check counts it (from its return until its
// release or LostSlack before its Lost; an open hold until lim.End). A term
// held across the heal counts.
func (h *History) CheckLeading(res string, heals []time.Duration, back time.Duration, lim Limits) (bad []Violation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if lim.End == 0 {
		lim.End = math.MaxInt64 / 2
	}
	for _, at := range heals {
		led := false
		for _, hd := range h.holds {
			if hd.Res != res || !hd.Held() || hd.Ambiguous {
				continue
			}
			from, to := h.checked(hd, lim)
			if from <= at+back && to > at {
				led = true
				break
			}
		}
		if !led {
			bad = append(bad, Violation{At: at, Kind: KindLeaderless,
				Msg: fmt.Sprintf("nobody led %s within %v of the heal at %s", res, back, At(at))})
		}
	}
	return bad
}
