package lockcheck

import (
	"slices"
	"testing"
	"time"
)

// term is a term of the election "e" held by candidate c, published with
// values, from its Campaign's call and return until its Resign began (ms;
// -1: never).
func term(c string, fence int64, call, ret, resign int, values ...string) *Hold {
	hd := NewHold()
	hd.Res, hd.Who, hd.Client, hd.Fence, hd.Values = "e", c, c, fence, values
	hd.Invoke, hd.Start = ms(call), ms(ret)
	if resign >= 0 {
		hd.ReleaseAt = ms(resign)
	}
	return hd
}

// TestCheckObserved: what observers of an election saw, in order, against
// the terms, on histories made up for it: every kind of violation can be
// found, and what an observer may see is not one.
func TestCheckObserved(t *testing.T) {
	obs := func(who string, at int, term int64, value string) Observation {
		return Observation{At: ms(at), Who: who, Res: "e", Term: term, Value: value}
	}
	terms := []*Hold{
		term("a", 5, 0, 1, 100, "a.0", "a.1"),
		term("b", 6, 50, 101, 200, "b.0"),
		term("c", 7, 150, 201, 300, "c.0"),
	}
	cases := []struct {
		name string
		obs  []Observation
		want []string // kinds, sorted
	}{
		{"every term and value in order", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 50, 5, "a.1"), obs("o1", 102, 6, "b.0"), obs("o1", 202, 7, "c.0")}, nil},
		{"a slow reader: the latest value of each term", []Observation{
			obs("o1", 2, 5, "a.1"), obs("o1", 150, 6, "b.0"), obs("o1", 250, 7, "c.0")}, nil},
		{"two observers, each in order", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o2", 3, 5, "a.0"), obs("o2", 102, 6, "b.0"), obs("o1", 103, 6, "b.0")}, nil},
		{"a term going back", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 102, 6, "b.0"), obs("o1", 103, 5, "a.1")},
			[]string{KindObservedBack}},
		{"back below an earlier term, not only the last", []Observation{
			obs("o1", 2, 6, "b.0"), obs("o1", 202, 7, "c.0"), obs("o1", 203, 6, "b.0"), obs("o1", 204, 6, "x")},
			[]string{KindObservedBack, KindObservedBack}},
		{"a term again, unchanged", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 3, 5, "a.0")},
			[]string{KindObservedAgain}},
		{"a value with a later term", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 102, 6, "a.1")},
			[]string{KindObservedWrong}},
		{"a Proclaim's value with an earlier term", []Observation{
			obs("o1", 2, 4, "a.1"), obs("o1", 3, 5, "a.0")},
			[]string{KindObservedWrong}},
		{"a Campaign's value with an earlier term of its own", []Observation{
			obs("o1", 2, 4, "a.0"), obs("o1", 3, 5, "a.0")}, nil},
		{"a term skipped", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 202, 7, "c.0")},
			[]string{KindObservedMissed}},
		{"a term elected before the observer listened", []Observation{
			obs("o1", 60, 5, "a.1"), obs("o1", 202, 7, "c.0")}, nil},
		{"the latest term not seen yet (the caller's to check)", []Observation{
			obs("o1", 2, 5, "a.0"), obs("o1", 102, 6, "b.0")}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := history(terms, nil, nil)
			for _, o := range tc.obs {
				h.Observed(o)
			}
			if got := kinds(h.CheckObserved()); !slices.Equal(got, tc.want) {
				t.Errorf("got violations %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckLeading: a leader within the limit of every heal, counting a
// term held across the heal, not one that ended before it or began too late.
func TestCheckLeading(t *testing.T) {
	const back = 100 * time.Millisecond
	lostAt := func(h *Hold, n int) *Hold { h.LostAt = ms(n); return h }
	failed := func(h *Hold) *Hold { h.Err = "ctx"; return h }
	cases := []struct {
		name  string
		terms []*Hold
		heals []int // ms
		want  []string
	}{
		{"a term elected after the heal", []*Hold{term("a", 1, 0, 10, 20), term("b", 2, 15, 550, 600)}, []int{500}, nil},
		{"a term held across the heal", []*Hold{term("a", 1, 0, 10, 900)}, []int{500}, nil},
		{"a term open at the end", []*Hold{term("a", 1, 0, 10, -1)}, []int{500}, nil},
		{"elected too late", []*Hold{term("a", 1, 0, 10, 20), term("b", 2, 15, 601, 700)}, []int{500},
			[]string{KindLeaderless}},
		{"resigned before the heal", []*Hold{term("a", 1, 0, 10, 499)}, []int{500},
			[]string{KindLeaderless}},
		{"lost before the heal, resigned after", []*Hold{lostAt(term("a", 1, 0, 10, 900), 400)}, []int{500},
			[]string{KindLeaderless}},
		{"a Campaign that failed", []*Hold{failed(term("a", 0, 0, 550, -1))}, []int{500},
			[]string{KindLeaderless}},
		{"each heal on its own", []*Hold{term("a", 1, 0, 10, 120), term("b", 2, 15, 1550, 1600)}, []int{100, 500, 1500},
			[]string{KindLeaderless}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := history(tc.terms, nil, nil)
			var heals []time.Duration
			for _, at := range tc.heals {
				heals = append(heals, ms(at))
			}
			got := h.CheckLeading("e", heals, back, Limits{LostSlack: 25 * time.Millisecond})
			if !slices.Equal(kinds(got), tc.want) {
				t.Errorf("got violations %v, want kinds %q", got, tc.want)
			}
		})
	}
}
