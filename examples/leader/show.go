package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// span is a term as its leader lived it: from the moment it started leading
// until it stopped, or was killed.
type span struct {
	term       int64
	id         int
	since      int64     // when it began on the Redis server's clock, Unix ms; 0 if unknown
	start, end time.Time // on this host's clock
	ended      bool      // it said it stopped leading
	stoppedBy  string    // "SIGKILL" (then end is the kill) or "SIGTERM"; "" if not stopped by the parent
}

// over reports whether the term is over, and end known.
func (sp *span) over() bool { return sp.ended || sp.stoppedBy == "SIGKILL" }

// handOver is the time from the end of a term that the parent stopped to
// the start of the next.
type handOver struct {
	how  string // "SIGKILL" or "Resign"
	took time.Duration
}

// handOverTo returns the hand-over from prev to next, if prev was stopped
// by the parent and is over.
func handOverTo(prev, next *span) (handOver, bool) {
	switch {
	case prev == nil || prev.stoppedBy == "" || !prev.over():
		return handOver{}, false
	case prev.stoppedBy == "SIGKILL":
		return handOver{how: "SIGKILL", took: next.start.Sub(prev.end)}, true
	}
	return handOver{how: "Resign", took: next.start.Sub(prev.end)}, true
}

// show prints the replicas' notes as they arrive, stops each leader once it
// has run its job -jobs times (the first with SIGKILL, the others with
// SIGTERM), and keeps what the verdict needs.
type show struct {
	out     io.Writer
	cfg     config
	reps    *replicas
	running int

	terms   map[int64]*span
	last    *span              // the latest term
	leading *span              // the term whose jobs are counted, nil while none
	jobs    int                // its runs of the job that the register took
	stopped map[int]string     // replica -> the signal that stopped it
	pending map[int64][]string // followers' lines about a term whose leader has not said it leads yet
}

func newShow(out io.Writer, cfg config, reps *replicas) *show {
	return &show{
		out: out, cfg: cfg, reps: reps, running: len(reps.procs),
		terms: map[int64]*span{}, stopped: map[int]string{}, pending: map[int64][]string{},
	}
}

func (sh *show) line(who, format string, args ...interface{}) {
	fmt.Fprintf(sh.out, "%-11s %s\n", who, fmt.Sprintf(format, args...))
}

// follow takes the replicas' notes until every replica has ended. It
// returns an error if a replica failed, or ctx ended first.
func (sh *show) follow(ctx context.Context) error {
	for sh.running > 0 {
		select {
		case a := <-sh.reps.arrivals:
			var err error
			if a.exited {
				err = sh.exited(a)
			} else {
				err = sh.take(a)
			}
			if err != nil && ctx.Err() == nil {
				return err
			}
		case <-ctx.Done():
			return fmt.Errorf("%d replicas still running: %w", sh.running, context.Cause(ctx))
		}
	}
	return nil
}

// exited handles the end of a replica: an error unless the parent stopped
// it (with SIGTERM, it must have ended well).
func (sh *show) exited(a arrival) error {
	sh.running--
	switch how, stopped := sh.stopped[a.id]; {
	case !stopped && a.err == nil:
		return fmt.Errorf("replica-%d ended by itself", a.id)
	case !stopped:
		return fmt.Errorf("replica-%d ended by itself: %w", a.id, a.err)
	case how == "SIGTERM" && a.err != nil:
		return fmt.Errorf("replica-%d, stopped with SIGTERM: %w", a.id, a.err)
	}
	return nil
}

// take handles a note. It returns an error if the note shows a replica
// failed.
func (sh *show) take(a arrival) error {
	name := "replica-" + strconv.Itoa(a.id)
	n := a.note
	at := time.Unix(0, n.At)
	switch n.Kind {
	case "campaigns":
		sh.line(name, "campaigns (pid %d)", n.PID)
	case "leads":
		sh.leads(a.id, n.Term, n.Since, at)
	case "sees":
		l := fmt.Sprintf("%-11s sees %s lead: term %d (pid %d)\n", name, n.Who, n.Term, n.PID)
		if sh.terms[n.Term] == nil {
			sh.pending[n.Term] = append(sh.pending[n.Term], l)
			return nil
		}
		fmt.Fprint(sh.out, l)
	case "job":
		if !n.OK {
			sh.line(name, "job %d: the register REFUSED term %d: a later term wrote before it", n.N, n.Term)
			return fmt.Errorf("%s leads term %d, which the register refused: two leaders at once", name, n.Term)
		}
		sh.line(name, "job %d: the register took term %d", n.N, n.Term)
		if sp := sh.leading; sp != nil && sp.term == n.Term {
			if sh.jobs++; sh.jobs == sh.cfg.jobs {
				return sh.stop(sp)
			}
		}
	case "stops":
		sp := sh.terms[n.Term]
		if sp == nil {
			return fmt.Errorf("%s stops term %d, which it never said it led", name, n.Term)
		}
		sp.end, sp.ended = at, true
		sh.line(name, "stops leading term %d: %s", n.Term, n.Why)
		if sh.leading == sp {
			sh.leading = nil
		}
	default:
		return fmt.Errorf("%s: unexpected output %q", name, n.Why)
	}
	return nil
}

// leads starts the term of replica id.
func (sh *show) leads(id int, term, since int64, at time.Time) {
	sp := &span{term: term, id: id, since: since, start: at}
	after := ""
	if h, ok := handOverTo(sh.last, sp); ok {
		after = ", " + sh.describe(h, sh.last.id)
	}
	sh.terms[term], sh.last = sp, sp
	sh.leading, sh.jobs = sp, 0
	sh.line(fmt.Sprintf("replica-%d", id), "leads: term %d%s", term, after)
	for _, l := range sh.pending[term] {
		fmt.Fprint(sh.out, l)
	}
	delete(sh.pending, term)
}

// stop stops the leader of sp: the first with SIGKILL, the others with
// SIGTERM.
func (sh *show) stop(sp *span) error {
	name := "replica-" + strconv.Itoa(sp.id)
	p := sh.reps.procs[sp.id-1]
	sh.leading = nil
	if len(sh.stopped) == 0 {
		sh.stopped[sp.id], sp.stoppedBy = "SIGKILL", "SIGKILL"
		if err := p.cmd.Process.Kill(); err != nil {
			return fmt.Errorf("killing %s: %w", name, err)
		}
		sp.end = time.Now() // it can act no more
		sh.line("--", "SIGKILL to %s (pid %d): it resigns nothing; its term ends when its lease, renewed every third of a lease, runs out",
			name, p.cmd.Process.Pid)
		return nil
	}
	sh.stopped[sp.id], sp.stoppedBy = "SIGTERM", "SIGTERM"
	sh.line("--", "SIGTERM to %s (pid %d), as a rolling deploy does: Run's context ends, and it resigns", name, p.cmd.Process.Pid)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	return nil
}

// describe renders a hand-over from replica prev: in leases after a
// SIGKILL.
func (sh *show) describe(h handOver, prev int) string {
	if h.how == "SIGKILL" {
		return fmt.Sprintf("%.2f leases (%v) after the SIGKILL", leases(h.took, sh.cfg.lease), h.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%v after replica-%d stopped and resigned", h.took.Round(10*time.Microsecond), prev)
}

func leases(d, lease time.Duration) float64 { return float64(d) / float64(lease) }

// report prints the terms, the register's writes and the verdict, and
// reports whether the run was sound.
func (sh *show) report(ws []write) bool {
	spans := make([]*span, 0, len(sh.terms))
	for _, sp := range sh.terms {
		spans = append(spans, sp)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].term < spans[j].term })
	var led []string
	for _, sp := range spans {
		s := fmt.Sprintf("replica-%d", sp.id)
		if sp.stoppedBy == "SIGKILL" {
			s += " (killed)"
		}
		led = append(led, s)
	}
	fmt.Fprintf(sh.out, "terms:      %d, led in turn by %s\n", len(spans), strings.Join(led, ", "))
	fmt.Fprintf(sh.out, "register:   %s\n", describeWrites(ws))
	v := verdict(spans, ws, sh.cfg.lease)
	fmt.Fprintf(sh.out, "verdict:    %s\n", v)
	return strings.HasPrefix(v, "ok: ")
}

// write is one entry of the register's log.
type write struct {
	term  int64
	id, n int
	at    int64 // on the Redis server's clock, Unix ms
	ok    bool
}

// parseWrites reads the register's log.
func parseWrites(log []string) ([]write, error) {
	ws := make([]write, len(log))
	for k, e := range log {
		var status string
		if _, err := fmt.Sscan(e, &ws[k].term, &ws[k].id, &ws[k].n, &ws[k].at, &status); err != nil {
			return nil, fmt.Errorf("the register's write %d reads %q: %w", k+1, e, err)
		}
		ws[k].ok = status == "ok"
	}
	return ws, nil
}

// serverTime renders a time on the Redis server's clock in Unix ms.
func serverTime(ms int64) string { return time.UnixMilli(ms).UTC().Format("15:04:05.000") }

// describeWrites renders the register's log.
func describeWrites(ws []write) string {
	terms, refused := map[int64]bool{}, 0
	for _, w := range ws {
		terms[w.term] = true
		if !w.ok {
			refused++
		}
	}
	return fmt.Sprintf("%d writes by %d terms, %d refused", len(ws), len(terms), refused)
}

// verdict judges a run, with spans in the order of their terms: no write
// to the register may come after a later term began (on the Redis
// server's clock, to the millisecond: a write in the millisecond in which
// the later term began is not judged); the register, in the order of its
// writes, must never have seen a term lower than one it took; every term
// must have ended; and the first hand-over is the SIGKILL's.
func verdict(spans []*span, ws []write, lease time.Duration) string {
	var hands []handOver
	for i, sp := range spans {
		if !sp.over() {
			return fmt.Sprintf("FAIL: term %d of replica-%d never ended", sp.term, sp.id)
		}
		for _, w := range ws {
			if w.term < sp.term && sp.since > 0 && w.at > sp.since {
				return fmt.Sprintf("FAIL: two leaders at once: replica-%d wrote with term %d at %s, after replica-%d's term %d began at %s",
					w.id, w.term, serverTime(w.at), sp.id, sp.term, serverTime(sp.since))
			}
		}
		if i > 0 {
			if h, ok := handOverTo(spans[i-1], sp); ok {
				hands = append(hands, h)
			}
		}
	}
	var last int64
	for k, w := range ws {
		if w.term < last || !w.ok {
			return fmt.Sprintf("FAIL: a term went back at the register: its write %d, by replica-%d, has term %d after term %d",
				k+1, w.id, w.term, last)
		}
		last = w.term
	}
	if len(hands) == 0 || hands[0].how != "SIGKILL" {
		return "FAIL: nobody led after the SIGKILL"
	}
	s := fmt.Sprintf("ok: one leader at a time, the register saw the terms only rise; the next leader led %.2f leases after the SIGKILL",
		leases(hands[0].took, lease))
	var resign []string
	for _, h := range hands[1:] {
		resign = append(resign, h.took.Round(10*time.Microsecond).String())
	}
	if len(resign) > 0 {
		s += ", " + strings.Join(resign, ", ") + " after a Resign"
	}
	return s
}
