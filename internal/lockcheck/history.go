package lockcheck

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// None is a time that has not come: a hold not lost, not released.
const None = time.Duration(math.MinInt64)

// Mode says how a hold counts against its lock.
type Mode int

const (
	Exclusive Mode = iota // a DistMutex hold, a DistRWMutex writer
	Shared                // a DistRWMutex reader
	Permits               // a DistSemaphore's acquisition of Hold.Permits
)

// Hold is one lock call and, if it succeeded (Err is ""), the hold it made.
// Times are offsets from the history's start (see History.Rel). A Hold is
// changed only through its History (its methods, or Update).
type Hold struct {
	ID      int    // given by AddHold, from 1
	Res     string // the lock, e.g. "mutex m"
	Who     string // the holder: a goroutine of a Client or process
	Client  string // the Client or process it belongs to
	Mode    Mode
	Permits int64 // Mode Permits
	Fence   int64
	MinHold time.Duration

	Invoke, Start time.Duration // the lock call's invocation and return
	Deadline      time.Duration // the lock call's deadline, or None
	Err           string        // why the lock call failed; "" when it held

	LostAt    time.Duration // when a watcher saw Lost closed, or None
	ReleaseAt time.Duration // when its (final) release began, or None
	// ReleaseRet and ReleaseDeadline are when the release returned and
	// its deadline, or None; ReleaseErr is why it failed, "" if it did not.
	ReleaseRet, ReleaseDeadline time.Duration
	ReleaseErr                  string

	// Ambiguous: Lost was closed already when the hold was recorded (lost
	// at once); such a hold is not checked.
	Ambiguous bool
	// IgnoreLost: a fake holder that does not watch Lost (a checker's own
	// test): it believes it holds until it releases.
	IgnoreLost bool

	Writes []Write // to the fenced register, in order
	// Values are what an election's term published (Campaign's value, then
	// each Proclaim's), in order; see CheckObserved.
	Values []string
}

// Write is one write of a hold to the fenced register.
type Write struct {
	Op        string // begin or end
	Call, Ret time.Duration
	Res       string // "1" accepted, "0" refused, else the error
}

// NewHold is a hold with no times yet (every time None).
func NewHold() *Hold {
	return &Hold{Deadline: None, LostAt: None, ReleaseAt: None, ReleaseRet: None, ReleaseDeadline: None}
}

// Held reports whether the lock call held.
func (hd *Hold) Held() bool { return hd.Err == "" }

// lost reports whether the hold was lost before (or without) its release.
func (hd *Hold) lost() bool {
	return hd.LostAt != None && (hd.ReleaseAt == None || hd.LostAt < hd.ReleaseAt)
}

// lostBy reports whether the hold's Lost had closed by t.
func (hd *Hold) lostBy(t time.Duration) bool { return hd.LostAt != None && hd.LostAt <= t }

func (hd *Hold) String() string {
	s := fmt.Sprintf("hold#%d %s %s fence=%d [%s", hd.ID, hd.Who, hd.Res, hd.Fence, At(hd.Start))
	if hd.Mode == Permits {
		s = fmt.Sprintf("hold#%d %s %s permits=%d fence=%d [%s", hd.ID, hd.Who, hd.Res, hd.Permits, hd.Fence, At(hd.Start))
	} else if hd.Mode == Shared {
		s = fmt.Sprintf("hold#%d %s %s (read) [%s", hd.ID, hd.Who, hd.Res, At(hd.Start))
	}
	switch {
	case hd.lost():
		s += ", lost " + At(hd.LostAt)
	case hd.ReleaseAt != None && hd.ReleaseErr != "":
		s += ", released " + At(hd.ReleaseAt) + " (failed)"
	case hd.ReleaseAt != None:
		s += ", released " + At(hd.ReleaseAt)
	default:
		s += ", open"
	}
	return s + ")"
}

// At formats a time of the history: "+1.234567s".
func At(d time.Duration) string { return fmt.Sprintf("+%.6fs", d.Seconds()) }

// Event is one line of the history: a call's invocation or return, a
// fault, a loss seen, a probe.
type Event struct {
	At   time.Duration
	Who  string
	What string
}

// Probe is a disagreement between a hold and what Redis held.
type Probe struct {
	At   time.Duration
	Hold *Hold
	Msg  string
	Near bool // Lost closed within the grace after the read
}

// History is what a run did, on one clock: its start's monotonic clock for
// times taken in the process (Now), its wall clock for times that holder
// processes report (Rel). Its methods may be called at once.
type History struct {
	start time.Time

	mu       sync.Mutex
	events   []Event
	holds    []*Hold
	probes   []Probe
	restarts []time.Duration // when Redis was killed
	faults   int
	bad      []Violation
	observed []Observation // by observers of elections, in the order received
}

// New returns an empty history that starts now.
func New() *History { return &History{start: time.Now()} }

// Now is the time since the start.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Rel is t (a wall-clock time, maybe of another process) as a time of the
// history.
func (h *History) Rel(t time.Time) time.Duration { return t.Round(0).Sub(h.start.Round(0)) }

// Log appends an event at now and returns now.
func (h *History) Log(who, format string, args ...any) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	at := h.Now()
	h.events = append(h.events, Event{At: at, Who: who, What: fmt.Sprintf(format, args...)})
	return at
}

// Event appends an event that happened at at.
func (h *History) Event(at time.Duration, who, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, Event{At: at, Who: who, What: what})
}

// Fault records a fault injected now (an event that counts as one).
func (h *History) Fault(who, format string, args ...any) time.Duration {
	at := h.Log(who, format, args...)
	h.mu.Lock()
	h.faults++
	h.mu.Unlock()
	return at
}

// AddHold records hd (made by NewHold), numbering it.
func (h *History) AddHold(hd *Hold) *Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.ID = len(h.holds) + 1
	h.holds = append(h.holds, hd)
	return hd
}

// Update changes holds of the history: f runs under its lock.
func (h *History) Update(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
}

// Lost records that hd's Lost was seen closed at at, or now if at is None.
func (h *History) Lost(hd *Hold, at time.Duration) {
	h.mu.Lock()
	if at == None {
		at = h.Now()
	}
	if hd.LostAt == None {
		hd.LostAt = at
	}
	h.mu.Unlock()
	h.Log(hd.Who, "Lost closed: %v", hd)
}

// Releasing records that hd's release begins now.
func (h *History) Releasing(hd *Hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.ReleaseAt == None {
		hd.ReleaseAt = h.Now()
	}
}

// ReleaseFailed records that hd's final release failed, and why.
func (h *History) ReleaseFailed(hd *Hold, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.ReleaseErr = why
}

// Watch records when lost closes, until the returned function stops it;
// that function waits for the watcher to exit.
func (h *History) Watch(hd *Hold, lost <-chan struct{}) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-lost:
			h.Lost(hd, None)
		case <-quit:
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// Restarted records a Redis restart (the kill) now.
func (h *History) Restarted() {
	at := h.Log("nemesis", "redis-server killed")
	h.mu.Lock()
	h.restarts = append(h.restarts, at)
	h.mu.Unlock()
}

// Violate records something wrong seen while the run went on, now.
func (h *History) Violate(kind, who, format string, args ...any) {
	at := h.Log(who, "VIOLATION %s: "+format, append([]any{kind}, args...)...)
	h.mu.Lock()
	h.bad = append(h.bad, Violation{At: at, Kind: kind, Msg: who + ": " + fmt.Sprintf(format, args...)})
	h.mu.Unlock()
}

// Probe records a disagreement between a hold and Redis.
func (h *History) Probe(p Probe) {
	h.Log(p.Hold.Who, "probe: %s (near miss: %v): %v", p.Msg, p.Near, p.Hold)
	h.mu.Lock()
	h.probes = append(h.probes, p)
	h.mu.Unlock()
}

// Counts are a history's figures.
type Counts struct {
	Calls, Held, Lost int // lock calls, holds, holds lost before their release
	Refused           int // register writes refused
	Faults, Restarts  int
}

// Counts returns the history's figures.
func (h *History) Counts() Counts {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := Counts{Calls: len(h.holds), Faults: h.faults, Restarts: len(h.restarts)}
	for _, hd := range h.holds {
		if hd.Held() {
			c.Held++
		}
		if hd.lost() {
			c.Lost++
		}
		for _, w := range hd.Writes {
			if w.Res == "0" {
				c.Refused++
			}
		}
	}
	return c
}

// Summary is the history's figures in a line.
func (h *History) Summary() string {
	c := h.Counts()
	return fmt.Sprintf("%d lock calls, %d held, %d lost, %d refused writes, %d faults (%d restarts) in %v",
		c.Calls, c.Held, c.Lost, c.Refused, c.Faults, c.Restarts, h.Now().Round(time.Second))
}

// sortedEvents returns the events in time order.
func (h *History) sortedEvents() []Event {
	h.mu.Lock()
	evs := slices.Clone(h.events)
	h.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	return evs
}

// Timeline returns the events from..to in time order, one a line: those of
// the named actors (and every violation), or all for who nil.
func (h *History) Timeline(from, to time.Duration, who map[string]bool) string {
	var b strings.Builder
	for _, e := range h.sortedEvents() {
		if e.At >= from && e.At <= to && (who == nil || who[e.Who] || strings.HasPrefix(e.What, "VIOLATION")) {
			fmt.Fprintf(&b, "%s %-8s %s\n", At(e.At), e.Who, e.What)
		}
	}
	return b.String()
}

// Around lists the events from before ahead of at to after it, in time
// order: at most max of the holders' (the nearest to at), and every event of
// the nemesis in three times that span before at, which explain them. The
// events at at are marked "=>".
func (h *History) Around(at, before, after time.Duration, max int) string {
	var sel, faults []Event
	for _, e := range h.sortedEvents() {
		switch {
		case e.At > at+after:
		case e.Who == "nemesis" && e.At >= at-3*before:
			faults = append(faults, e)
		case e.At >= at-before:
			sel = append(sel, e)
		}
	}
	for len(sel) > max { // drop the one farthest from at
		if at-sel[0].At > sel[len(sel)-1].At-at {
			sel = sel[1:]
		} else {
			sel = sel[:len(sel)-1]
		}
	}
	sel = append(sel, faults...)
	slices.SortStableFunc(sel, func(a, b Event) int { return cmp.Compare(a.At, b.At) })
	var b strings.Builder
	for _, e := range sel {
		mark := "  "
		if e.At == at {
			mark = "=>"
		}
		fmt.Fprintf(&b, "%s %s %-8s %s\n", mark, At(e.At), e.Who, e.What)
	}
	return b.String()
}
