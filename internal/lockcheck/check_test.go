package lockcheck

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// kinds returns the kinds of vs, sorted.
func kinds(vs []Violation) []string {
	var ks []string
	for _, v := range vs {
		ks = append(ks, v.Kind)
	}
	slices.Sort(ks)
	return ks
}

// history returns a history of holds, restarts (ms) and probes (of the
// first hold).
func history(holds []*Hold, restarts []int, probes []Probe) *History {
	h := New()
	for _, hd := range holds {
		h.AddHold(hd)
	}
	for _, r := range restarts {
		h.restarts = append(h.restarts, ms(r))
	}
	for _, p := range probes {
		p.Hold = holds[0]
		h.probes = append(h.probes, p)
	}
	return h
}

// TestCheckRobustness: the checks as the robustness test tunes them (a
// grace for near misses, restarts), on histories made up for them.
func TestCheckRobustness(t *testing.T) {
	// hold: res, client, mode, permits, fence; invoke, start, lost,
	// released in ms (-1: never).
	hold := func(res string, client int, mode Mode, permits, fence int64, invoke, start, lost, released int) *Hold {
		hd := NewHold()
		hd.Res, hd.Who, hd.Client, hd.Mode, hd.Permits, hd.Fence = res, fmt.Sprintf("c%d/w1", client), fmt.Sprint(client), mode, permits, fence
		hd.Invoke, hd.Start = ms(invoke), ms(start)
		if lost >= 0 {
			hd.LostAt = ms(lost)
		}
		if released >= 0 {
			hd.ReleaseAt = ms(released)
		}
		return hd
	}
	const m, rw, sem = "mutex m", "rwmutex rw", "semaphore sem"
	ex, sh, pm := Exclusive, Shared, Permits
	ignoring := func(h *Hold) *Hold { h.IgnoreLost = true; return h }
	minHold := func(h *Hold, d int) *Hold { h.MinHold = ms(d); return h }
	failed := func(h *Hold) *Hold { h.ReleaseErr = "context deadline exceeded"; return h }
	tests := []struct {
		name      string
		holds     []*Hold
		restarts  []int
		probes    []Probe
		bad, near []string // kinds
	}{
		{name: "one after the other", holds: []*Hold{
			hold(m, 1, ex, 0, 1, 0, 1, -1, 100), hold(m, 2, ex, 0, 2, 50, 100, -1, 200)}},
		{name: "second taken while the first believes it holds", holds: []*Hold{
			hold(m, 1, ex, 0, 1, 0, 1, -1, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			bad: []string{KindOverlap}},
		{name: "first lost before the second took it", holds: []*Hold{
			hold(m, 1, ex, 0, 1, 0, 1, 90, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)}},
		{name: "first lost just after: within the grace", holds: []*Hold{
			hold(m, 1, ex, 0, 1, 0, 1, 105, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			near: []string{KindOverlap}},
		{name: "a holder that ignores Lost", holds: []*Hold{
			ignoring(hold(m, 1, ex, 0, 1, 0, 1, 90, 200)), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)},
			bad: []string{KindOverlap}},
		{name: "a hold live across a Redis restart", holds: []*Hold{
			hold(m, 1, ex, 0, 1, 0, 1, 150, 200), hold(m, 2, ex, 0, 2, 50, 100, -1, 300)}, restarts: []int{60}},
		{name: "readers share", holds: []*Hold{
			hold(rw, 1, sh, 0, 0, 0, 1, -1, 200), hold(rw, 2, sh, 0, 0, 50, 100, -1, 300)}},
		{name: "writer beside a reader", holds: []*Hold{
			hold(rw, 1, sh, 0, 0, 0, 1, -1, 200), hold(rw, 2, ex, 0, 5, 50, 100, -1, 300)},
			bad: []string{KindOverlap}},
		{name: "permits within the size", holds: []*Hold{
			hold(sem, 1, pm, 2, 1, 0, 1, -1, 200), hold(sem, 2, pm, 1, 2, 50, 100, -1, 300)}},
		{name: "permits beyond the size", holds: []*Hold{
			hold(sem, 1, pm, 2, 1, 0, 1, -1, 200), hold(sem, 2, pm, 1, 2, 50, 100, -1, 300),
			hold(sem, 3, pm, 1, 3, 50, 150, -1, 190)},
			bad: []string{KindOverlap}},
		{name: "fence went back", holds: []*Hold{
			hold(m, 1, ex, 0, 10, 0, 1, -1, 50), hold(m, 2, ex, 0, 9, 60, 70, -1, 80)},
			bad: []string{KindFenceBack}},
		{name: "concurrent calls may return fences in either order", holds: []*Hold{
			hold(m, 1, ex, 0, 10, 0, 100, -1, 150), hold(m, 2, ex, 0, 9, 0, 20, -1, 50)}},
		{name: "fence given twice", holds: []*Hold{
			hold(m, 1, ex, 0, 7, 0, 1, -1, 50), hold(m, 2, ex, 0, 7, 0, 60, -1, 80)},
			bad: []string{KindSharedFence}},
		{name: "minimum hold not kept", holds: []*Hold{
			minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300), hold(m, 2, ex, 0, 2, 10, 100, -1, 150)},
			bad: []string{KindMinHold}},
		{name: "minimum hold of a release that failed", holds: []*Hold{
			failed(minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300)), hold(m, 2, ex, 0, 2, 10, 100, -1, 150)}},
		{name: "minimum hold kept", holds: []*Hold{
			minHold(hold(m, 1, ex, 0, 1, 0, 1, -1, 50), 300), hold(m, 2, ex, 0, 2, 10, 301, -1, 350)}},
		{name: "a probe that found another hold", holds: []*Hold{hold(m, 1, ex, 0, 1, 0, 1, -1, 50)},
			probes: []Probe{{At: ms(5), Msg: "no holder"}}, bad: []string{KindProbe}},
		{name: "a probe after a Redis restart", holds: []*Hold{hold(m, 1, ex, 0, 1, 0, 1, -1, 50)},
			probes: []Probe{{At: ms(5), Msg: "no holder"}}, restarts: []int{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := history(tt.holds, tt.restarts, tt.probes)
			bad, near := h.Check(Limits{Size: map[string]int64{sem: 3}, Grace: ms(10), End: ms(1000)})
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

// TestCheckPartition: the checks as the partition suite tunes them (a
// slack on Lost, no grace, fences by return for exclusive locks, late
// calls, register writes), on histories made up for them.
func TestCheckPartition(t *testing.T) {
	const slack, late = 25 * time.Millisecond, 300 * time.Millisecond
	// hold: proc, write, fence, lock call/return and unlock call (ms); the
	// deadlines are far.
	hold := func(proc string, write bool, fence int64, call, ret, unlock int) *Hold {
		hd := NewHold()
		hd.Res, hd.Who, hd.Client, hd.Fence, hd.Mode = "partition", proc, proc, fence, Shared
		if write {
			hd.Mode = Exclusive
		}
		hd.Invoke, hd.Start, hd.Deadline = ms(call), ms(ret), ms(ret+1000)
		hd.ReleaseAt, hd.ReleaseRet, hd.ReleaseDeadline = ms(unlock), ms(unlock+1), ms(unlock+1000)
		return hd
	}
	permits := func(hs ...*Hold) []*Hold {
		for _, hd := range hs {
			hd.Mode, hd.Permits = Permits, 1
		}
		return hs
	}
	lostAt := func(h *Hold, n int) *Hold { h.LostAt = ms(n); return h }
	cases := []struct {
		name  string
		kind  string
		holds []*Hold
		want  []string // kinds found, sorted
	}{
		{"in turn", "mutex", []*Hold{hold("a", true, 1, 0, 1, 10), hold("b", true, 2, 5, 11, 20)}, nil},
		{"taken over, not lost", "mutex", []*Hold{hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)},
			[]string{KindOverlap}},
		{"taken over after Lost", "mutex", []*Hold{lostAt(hold("a", true, 1, 0, 1, 100), 40), hold("b", true, 2, 5, 50, 60)}, nil},
		{"taken over within the slack before Lost", "mutex", []*Hold{lostAt(hold("a", true, 1, 0, 1, 100), 50+10), hold("b", true, 2, 5, 50, 60)}, nil},
		{"taken over long before Lost", "mutex", []*Hold{lostAt(hold("a", true, 1, 0, 1, 100), 90), hold("b", true, 2, 5, 50, 60)},
			[]string{KindOverlap}},
		{"taken over by a hold lost at once", "mutex", []*Hold{hold("a", true, 1, 0, 1, 100), lostAt(hold("b", true, 2, 5, 50, 60), 51)},
			[]string{KindOverlap}},
		{"fence went back", "mutex", []*Hold{hold("a", true, 5, 0, 1, 10), hold("b", true, 4, 12, 13, 20)},
			[]string{KindFenceBack}},
		{"fence repeated", "mutex", []*Hold{hold("a", true, 5, 0, 1, 10), hold("b", true, 5, 12, 13, 20)},
			[]string{KindFenceBack, KindSharedFence}},
		{"returned after a larger fence", "mutex", []*Hold{hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 1, 12, 20)},
			[]string{KindFenceBack}},
		{"permits, concurrent calls", "sem", permits(hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 1, 12, 20)), nil},
		{"permits, fence went back", "sem", permits(hold("a", true, 5, 0, 10, 11), hold("b", true, 4, 11, 12, 20)),
			[]string{KindFenceBack}},
		{"readers together", "rw", []*Hold{hold("a", false, 1, 0, 1, 100), hold("b", false, 1, 5, 50, 60)}, nil},
		{"writer among readers", "rw", []*Hold{hold("a", false, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)},
			[]string{KindOverlap}},
		{"two of two permits", "sem", permits(hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 50, 60)), nil},
		{"three of two permits", "sem", permits(hold("a", true, 1, 0, 1, 100), hold("b", true, 2, 5, 20, 100),
			hold("c", true, 3, 5, 50, 60)), []string{KindOverlap}},
		{"lock late", "mutex", []*Hold{func() *Hold {
			h := hold("a", true, 1, 0, 1000, 1010)
			h.Deadline = ms(1000) - late - time.Millisecond
			return h
		}()}, []string{KindLate}},
		{"lock late, not held", "mutex", []*Hold{func() *Hold {
			h := hold("a", true, 0, 0, 1000, 1010)
			h.Err, h.ReleaseAt, h.ReleaseRet = "ctx", None, None
			h.Deadline = ms(1000) - late - time.Millisecond
			return h
		}()}, []string{KindLate}},
		{"unlock late", "mutex", []*Hold{func() *Hold {
			h := hold("a", true, 1, 0, 1, 10)
			h.ReleaseRet = h.ReleaseDeadline + late + time.Millisecond
			return h
		}()}, []string{KindLate}},
		{"refused, lost", "mutex", []*Hold{func() *Hold {
			h := lostAt(hold("a", true, 1, 0, 1, 10), 4)
			h.Writes = []Write{{Op: "end", Call: ms(5), Ret: ms(6), Res: "0"}}
			return h
		}()}, nil},
		{"refused, not lost", "mutex", []*Hold{func() *Hold {
			h := hold("a", true, 1, 0, 1, 10)
			h.Writes = []Write{{Op: "end", Call: ms(5), Ret: ms(6), Res: "0"}}
			return h
		}()}, []string{KindRefused}},
		{"a write that failed", "mutex", []*Hold{func() *Hold {
			h := hold("a", true, 1, 0, 1, 10)
			h.Writes = []Write{{Op: "begin", Call: ms(2), Ret: ms(3), Res: "error:i/o_timeout"}}
			return h
		}()}, []string{KindRegister}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := history(tc.holds, nil, nil)
			lim := Limits{Size: map[string]int64{}, LostSlack: slack, Late: late, FencesByReturn: tc.kind != "sem"}
			if tc.kind == "sem" {
				lim.Size["partition"] = 2
			}
			bad, near := h.Check(lim)
			if got := kinds(bad); !slices.Equal(got, tc.want) {
				t.Errorf("got violations %q, want %q; %v", got, tc.want, bad)
			}
			if len(near) > 0 {
				t.Errorf("got near misses %v, want none without a grace", near)
			}
		})
	}
}

// TestCheckRegister: what the register's log shows wrong, but its refusals
// (held against the holds' Lost by Check).
func TestCheckRegister(t *testing.T) {
	w := func(fence int64, writer string, start, end int64) redistest.Write {
		return redistest.Write{OK: true, Fence: fence, Writer: writer, Start: start, End: end}
	}
	h := New()
	overlap := redistest.Anomaly{Kind: redistest.Overlap, A: w(1, "a", 10, 30), B: w(2, "b", 20, 40)}
	refused := redistest.Anomaly{Kind: redistest.Refused, B: redistest.Write{Fence: 1, Writer: "a", Start: 50, End: 50}}
	if got := kinds(h.CheckRegister(nil, []redistest.Anomaly{overlap, refused}, 0)); !slices.Equal(got, []string{KindRegister}) {
		t.Errorf("mutex: got %v, want one %q (the overlap, not the refusal)", got, KindRegister)
	}
	three := []redistest.Write{w(0, "a", 10, 100), w(0, "b", 20, 100), w(0, "c", 30, 100)}
	if got := kinds(h.CheckRegister(three, nil, 2)); !slices.Equal(got, []string{KindRegister}) {
		t.Errorf("semaphore of 2, three writers at once: got %v, want one %q", got, KindRegister)
	}
	if got := h.CheckRegister(three[:2], nil, 2); len(got) != 0 {
		t.Errorf("semaphore of 2, two writers at once: got %v, want none", got)
	}
}
