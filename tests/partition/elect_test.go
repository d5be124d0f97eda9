package partition

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/lockcheck"
	"github.com/remutex/remutex/internal/redistest"
)

// The election mode (kind "elect"): partCandidates candidate processes
// campaign in a loop on one DistElection, each term writing to the fenced
// register with its term as the fence, and partObservers observer processes
// report every leader Observe gives them; the nemesis cuts any of them, or
// Redis, off as it does the holders.

const (
	partCandidates = 3
	partObservers  = 2
)

// partMember is one process of a run: its network node and role.
type partMember struct {
	node, role string
}

// partMembers returns the processes of a run of kind: three holders, or
// an election's candidates and observers.
func partMembers(kind string) []partMember {
	var ms []partMember
	if kind != "elect" {
		for i := 1; i <= partHolders; i++ {
			ms = append(ms, partMember{"h" + strconv.Itoa(i), "partition"})
		}
		return ms
	}
	for i := 1; i <= partCandidates; i++ {
		ms = append(ms, partMember{"c" + strconv.Itoa(i), "candidate"})
	}
	for i := 1; i <= partObservers; i++ {
		ms = append(ms, partMember{"o" + strconv.Itoa(i), "observer"})
	}
	return ms
}

// childSetup is what every role of the suite's children opens: the lock's
// Redis through a Client, and the register; close closes them.
func childSetup(cfg redistest.HolderConfig) (c *remutex.Client, reg *redistest.Register, close func()) {
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr})
	c = remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
	reg = redistest.OpenRegister(cfg.Register, cfg.RegisterKey)
	return c, reg, func() {
		_ = c.Close()
		_ = rdb.Close()
		_ = reg.Close()
	}
}

// serveUntilStop is the rest of a child's life once its goroutines run:
// it reports "ready", reads stdin until "stop" (or its end), cancels the
// goroutines and waits until done is closed, closes what the child opened
// and reports "done".
func serveUntilStop(cancel func(), done <-chan struct{}, closeAll func()) int {
	redistest.Emit("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() && sc.Text() != "stop" {
	}
	cancel()
	<-done
	closeAll()
	redistest.Emit("done")
	return 0
}

// candidateRole is a candidate process of the election mode: it campaigns
// with a deadline of 0.5–6 s, and while it leads, for 0.1–1.5 s (a
// quarter of the terms: 1–3 leases) or until its term ends, writes to the register with its term as the fence
// (partSection) every 20–300 ms, proclaiming a new value after a quarter of
// the writes; a term that was lost makes, half the time, one more write
// with it (the late write of a leader that did not stop in time, which
// the register must refuse once a later term wrote); then it resigns with
// a deadline of 0.5–3 s, and campaigns again, until "stop". It emits the
// events of partitionRole for goroutine 0, a Campaign as a lock (with its
// value last) and a Resign as an unlock, and
//
//	p proclaim 0 <seq> <call> <deadline> <return> <error kind> <value>
//
// The values are <process>.<seq>.<n>: n counts the proclaims of a term.
func candidateRole(cfg redistest.HolderConfig) int {
	seed, _ := strconv.ParseUint(os.Getenv(partSeedChild), 10, 64)
	broken := os.Getenv(partBrokenEnv)
	c, reg, closeAll := childSetup(cfg)
	e := c.NewElection(cfg.Name, remutex.WithLease(cfg.Lease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seed, 0))
		for seq := 0; ctx.Err() == nil; seq++ {
			partTermOnce(ctx, rng, e, reg, broken, cfg.ID, seq)
		}
	}()
	return serveUntilStop(cancel, done, closeAll)
}

// partTermOnce is one Campaign and, if it leads, one term.
func partTermOnce(ctx context.Context, rng *rand.Rand, e *remutex.DistElection, reg *redistest.Register, broken, proc string, seq int) {
	between := func(lo, hi time.Duration) time.Duration { return partBetween(rng, lo, hi) }
	value := fmt.Sprintf("%s.%d.0", proc, seq)
	call := time.Now()
	deadline := call.Add(between(500*time.Millisecond, 6*time.Second))
	cctx, ccancel := context.WithDeadline(ctx, deadline)
	err := e.Campaign(cctx, value)
	ret := time.Now()
	ccancel()
	var term int64
	if err == nil {
		term = e.Term()
	}
	redistest.Emit("p", "lock", 0, seq, "w", call.UnixNano(), deadline.UnixNano(), ret.UnixNano(), errKind(err), term, value)
	if err != nil {
		return
	}
	tctx := e.Context() // ends when the term is lost (or resigned)
	unwatch := watchLost(e.Lost(), 0, seq)
	fence := term
	if broken == "stalefence" {
		fence--
	}
	writer := fmt.Sprintf("%s.%d", proc, seq)
	span := between(100*time.Millisecond, 1500*time.Millisecond)
	if rng.IntN(4) == 0 {
		span = between(partLease, 3*partLease) // long enough to be lost in a cut
	}
	end := time.Now().Add(span)
	for n := 1; time.Now().Before(end) && tctx.Err() == nil && ctx.Err() == nil; {
		partSection(ctx, rng, reg, fence, writer, 0, seq)
		if rng.IntN(4) == 0 {
			call := time.Now()
			deadline := call.Add(between(500*time.Millisecond, 3*time.Second))
			pctx, pcancel := context.WithDeadline(ctx, deadline)
			value := fmt.Sprintf("%s.%d.%d", proc, seq, n)
			err := e.Proclaim(pctx, value)
			pcancel()
			redistest.Emit("p", "proclaim", 0, seq, call.UnixNano(), deadline.UnixNano(), time.Now().UnixNano(), errKind(err), value)
			n++
		}
		pause := time.NewTimer(between(20*time.Millisecond, 300*time.Millisecond))
		select {
		case <-pause.C:
		case <-tctx.Done():
			pause.Stop()
		}
	}
	if tctx.Err() != nil && ctx.Err() == nil && rng.IntN(2) == 0 {
		partSection(ctx, rng, reg, fence, writer, 0, seq) // late, after the loss
	}
	unwatch()
	partRelease(ctx, rng, e.Resign, "w", 0, seq)
}

// observerRole is an observer process of the election mode: it emits every
// leader its Observe gives it, until "stop":
//
//	p observe <received> <term> <value>
func observerRole(cfg redistest.HolderConfig) int {
	c, _, closeAll := childSetup(cfg)
	e := c.NewElection(cfg.Name, remutex.WithLease(cfg.Lease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	leaders := e.Observe(ctx)
	go func() {
		defer close(done)
		for l := range leaders {
			redistest.Emit("p", "observe", time.Now().UnixNano(), l.Term, l.Value)
		}
	}()
	return serveUntilStop(cancel, done, closeAll)
}

// stopCandidates ends an election run's terms: it stops the candidates
// (each resigns) and waits until their reports are in the history, then
// until every observer received the highest term a Campaign returned, for
// at most partBack (a violation if not).
func (run *partRun) stopCandidates(t *testing.T) {
	t.Helper()
	var observers []*redistest.Child
	for i, ch := range run.children {
		if run.members[i].role != "candidate" {
			observers = append(observers, ch)
			continue
		}
		ch.Send(t, "stop")
		run.stopped[i] = true
	}
	for i, ch := range run.children {
		if !run.stopped[i] {
			continue
		}
		select {
		case <-run.collected[i]:
		case <-time.After(time.Minute):
			t.Fatalf("candidate %s did not exit within a minute of stop; stderr:\n%s", ch.ID(), ch.Stderr())
		}
	}
	top := run.hist.topTerm()
	ctx, cancel := context.WithTimeout(context.Background(), partBack)
	defer cancel()
	for _, ch := range observers {
		for run.hist.LastObserved(ch.ID()) < top {
			changed := run.hist.changed()
			if run.hist.LastObserved(ch.ID()) >= top {
				break
			}
			select {
			case <-changed:
				continue
			case <-ctx.Done():
			}
			now := run.hist.Now()
			run.hist.Violate(partObserver, ch.ID(), "had not received term %d (the last elected) %v after the candidates stopped; its last: %d; its events and the nemesis's before:\n%s",
				top, partBack, run.hist.LastObserved(ch.ID()),
				run.hist.Timeline(now-4*partBack, now, map[string]bool{ch.ID(): true, "nemesis": true}))
			break
		}
	}
}

// electSummary is an election run's figures in a line: terms, writes,
// proclaims, what the observers received.
func (run *partRun) electSummary(t *testing.T) string {
	t.Helper()
	c := run.hist.Counts()
	var proclaims, late, lateRefused int
	holds := run.hist.all()
	run.hist.Update(func() {
		for _, hd := range holds {
			proclaims += max(len(hd.Values)-1, 0)
			for _, w := range hd.Writes {
				if hd.LostAt != lockcheck.None && w.Call > hd.LostAt {
					late++
					if w.Res == "0" {
						lateRefused++
					}
				}
			}
		}
	})
	reg := run.register(t)
	var refused int
	for _, a := range reg.found {
		if a.Kind == redistest.Refused {
			refused++
		}
	}
	run.hist.mu.Lock()
	heals := len(run.hist.heals)
	run.hist.mu.Unlock()
	return fmt.Sprintf("election: %d campaigns, %d terms (the last %d), %d lost; %d proclaims; register: %d writes accepted, %d refused (of %d writes of lost terms, %d refused); observers received %v; %d faults, %d heals; seed %d",
		c.Calls, c.Held, run.hist.topTerm(), c.Lost, proclaims, len(reg.accepted), refused, late, lateRefused,
		run.hist.Observations(), c.Faults, heals, run.replay)
}
