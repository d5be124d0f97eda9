package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hand-off to an idle waiter: two clients (separate connection pools) take
// turns on one lock. The holder releases once the other side's Lock call has
// been waiting hoIdle; the figure is the time from the start of the release
// call to the return of the waiter's Lock. Then the new holder releases to
// the first, so that both directions are measured. Beside the libraries, in
// the same rotated rounds, the floor: a PUBLISH to a channel whose subscriber
// (a PubSub of the other client) has been idle as long, from the PUBLISH call
// to the subscriber's receive.
const (
	// hoIdle is how long the waiter has waited when the holder releases,
	// counted from the start of its Lock call (or of its ReceiveMessage):
	// long after its first attempt (a round trip) has failed and it has
	// queued or subscribed, long enough for its goroutines and the
	// processors to go idle, as a waiter that waits for real does.
	hoIdle = 3 * time.Millisecond
	// hoWarmUp is how many hand-offs go before a round's measured ones:
	// they open the connections, load the scripts and subscribe.
	hoWarmUp = 4
	// hoTimeout bounds the subscription of a floor's side.
	hoTimeout = 10 * time.Second
)

// The floors: the lowest a hand-off over pub/sub can take with go-redis.
const (
	hoFloor        = "PUBLISH → ReceiveMessage"
	hoFloorChannel = "PUBLISH → PubSub.Channel()"
)

// hoVariant is one thing handed over between two clients: a library's lock,
// or a pub/sub message.
type hoVariant struct {
	name, lib, setup string
	remutex, floor   bool
	// side builds side id (0 or 1) of a pair on the side's own goroutine:
	// the goroutines a client starts descend from it (see handoff_trace.go).
	side func(cfg config, name string, id int) (hoSide, error)
}

// hoSide is one client of a pair.
type hoSide interface {
	// start makes this side the first holder.
	start(ctx context.Context) error
	// await waits to be handed the lock (Lock) or the message (receive).
	await(ctx context.Context) error
	// release hands over to the other side (Unlock, or PUBLISH).
	release(ctx context.Context) error
	close()
}

// handoffVariants are the floors and every lock variant of vs: all of them
// block in Lock (redsync's and redislock's polling loops are retried by the
// harness as a caller would), and the polling ones show what polling costs.
// remutex runs twice: UnlockContext as in the other scenarios, and Unlock,
// the sync.Locker call with its own path (bounded by UnlockTimeout).
func handoffVariants(vs []variant) []hoVariant {
	hvs := []hoVariant{
		{name: hoFloor, lib: "go-redis", floor: true, side: pubSubSide(false),
			setup: "PUBLISH on one client; the other client's PubSub, idle in ReceiveMessage on the receiving goroutine (as remutex's own subscriber reads)"},
		{name: hoFloorChannel, lib: "go-redis", floor: true, side: pubSubSide(true),
			setup: "the same, the receiver reading PubSub.Channel() (go-redis's reader goroutine in between)"},
	}
	for _, v := range vs {
		hvs = append(hvs, hoVariant{name: v.name, lib: v.lib, setup: v.setup, remutex: v.remutex, side: lockSide(v, false)})
		if v.remutex {
			hvs = append(hvs, hoVariant{name: v.name + " (Unlock)", lib: v.lib, setup: "defaults; released with Unlock, not UnlockContext",
				side: lockSide(v, true)})
			plain := lockSide(v, true)
			hvs = append(hvs, hoVariant{name: v.name + " (Unlock, ContextTimeoutEnabled)", lib: v.lib,
				setup: "released with Unlock, on a go-redis client with ContextTimeoutEnabled",
				side: func(cfg config, name string, id int) (hoSide, error) {
					cfg.ctxTimeout = true
					return plain(cfg, name, id)
				}})
		}
	}
	return hvs
}

// lockSide is a side holding a mutex of v on a client of its own.
func lockSide(v variant, plainUnlock bool) func(cfg config, name string, id int) (hoSide, error) {
	return func(cfg config, name string, _ int) (hoSide, error) {
		cl, err := v.connect(cfg)
		if err != nil {
			return nil, err
		}
		s := &mutexSide{cl: cl, m: cl.mutex(name)}
		if rm, ok := s.m.(*remutexMutex); ok && plainUnlock {
			s.unlock = func(context.Context) error { rm.m.Unlock(); return nil }
		}
		return s, nil
	}
}

type mutexSide struct {
	cl     client
	m      mutex
	unlock func(context.Context) error // instead of m.unlock, if set
}

func (s *mutexSide) start(ctx context.Context) error { return s.m.lock(ctx) }
func (s *mutexSide) await(ctx context.Context) error { return s.m.lock(ctx) }
func (s *mutexSide) release(ctx context.Context) error {
	if s.unlock != nil {
		return s.unlock(ctx)
	}
	return s.m.unlock(ctx)
}
func (s *mutexSide) close() { s.cl.close() }

// pubSubSide is a side of the floor: a go-redis client that publishes to
// the other side's channel, and a PubSub of its own on its channel.
func pubSubSide(viaChannel bool) func(cfg config, name string, id int) (hoSide, error) {
	return func(cfg config, name string, id int) (hoSide, error) {
		ctx, cancel := context.WithTimeout(context.Background(), hoTimeout)
		defer cancel()
		rdb := goRedis(cfg)
		s := &pubSide{rdb: rdb, to: name + ":" + strconv.Itoa(1-id)}
		s.ps = rdb.Subscribe(ctx, name+":"+strconv.Itoa(id))
		if _, err := s.ps.Receive(ctx); err != nil { // the confirmation
			s.close()
			return nil, err
		}
		if viaChannel {
			s.ch = s.ps.Channel()
		}
		return s, nil
	}
}

type pubSide struct {
	rdb *redis.Client
	ps  *redis.PubSub
	ch  <-chan *redis.Message // PubSub.Channel(), or nil to call ReceiveMessage
	to  string                // the other side's channel
}

func (s *pubSide) start(context.Context) error { return nil }

func (s *pubSide) await(ctx context.Context) error {
	if s.ch == nil {
		_, err := s.ps.ReceiveMessage(ctx)
		return err
	}
	select {
	case <-s.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *pubSide) release(ctx context.Context) error {
	n, err := s.rdb.Publish(ctx, s.to, "x").Result()
	if err == nil && n != 1 {
		err = fmt.Errorf("PUBLISH reached %d subscribers, want 1", n)
	}
	return err
}

func (s *pubSide) close() {
	_ = s.ps.Close()
	_ = s.rdb.Close()
}

// errEarly is a hand-off whose waiter returned before the holder released:
// for a lock, two holders at once.
var errEarly = errors.New("the waiter returned before the holder released")

// hoRunner is the goroutine of one side: it builds the side, then runs the
// commands of the pair's driver, so that a lock is taken and released on the
// same goroutine (remutex's holds belong to goroutines).
type hoRunner struct {
	id      int
	cmds    chan hoCmd
	waiting chan time.Time // the other side's await began (sent by the other side)
	out     chan hoDone    // one per command
}

type hoCmd struct {
	op  int
	ctx context.Context // carries the hand-off's trace task in the traced phase
}

const (
	hoStart = iota
	hoAwait
	hoRelease
)

// hoDone is what a command did: when the release began or the await
// returned.
type hoDone struct {
	at  time.Time
	err error
}

// run builds the side and serves commands until cmds is closed.
func (r *hoRunner) run(v hoVariant, cfg config, name string, other *hoRunner) {
	trace.Log(context.Background(), hoTraceSide, strconv.Itoa(r.id))
	s, err := v.side(cfg, name, r.id)
	r.out <- hoDone{err: err}
	if err != nil {
		return
	}
	defer s.close()
	for c := range r.cmds {
		// No deadline on the calls (a hang ends the run, see guard): a
		// context that can end takes another path in some libraries, and
		// the other scenarios call them without one.
		ctx := c.ctx
		var d hoDone
		switch c.op {
		case hoStart:
			d.err = s.start(ctx)
		case hoAwait:
			other.waiting <- time.Now()
			trace.WithRegion(ctx, hoTraceAwait, func() { d.err = s.await(ctx) })
			d.at = time.Now()
		case hoRelease:
			began := <-r.waiting
			time.Sleep(time.Until(began.Add(hoIdle)))
			d.at = time.Now()
			trace.WithRegion(ctx, hoTraceRelease, func() { d.err = s.release(ctx) })
		}
		r.out <- d
	}
}

// hoPair is the two sides of one round, and which holds.
type hoPair struct {
	sides  [2]*hoRunner
	holder int
	done   chan struct{} // closed when both runners have ended
}

// newPair starts both sides of v on their goroutines and makes side 0 the
// holder.
func newPair(v hoVariant, cfg config) (*hoPair, error) {
	name := lockName("handoff1")
	p := &hoPair{done: make(chan struct{})}
	for i := range p.sides {
		p.sides[i] = &hoRunner{id: i, cmds: make(chan hoCmd, 1), waiting: make(chan time.Time, 1), out: make(chan hoDone, 1)}
	}
	ended := make(chan struct{}, 2)
	for i, r := range p.sides {
		go func() {
			defer func() { ended <- struct{}{} }()
			r.run(v, cfg, name, p.sides[1-i])
		}()
	}
	go func() {
		<-ended
		<-ended
		close(p.done)
	}()
	var errs []error
	for _, r := range p.sides {
		errs = append(errs, (<-r.out).err)
	}
	if err := errors.Join(errs...); err != nil {
		p.close()
		return nil, err
	}
	p.sides[0].cmds <- hoCmd{op: hoStart, ctx: context.Background()}
	if err := (<-p.sides[0].out).err; err != nil {
		p.close()
		return nil, fmt.Errorf("first lock: %w", err)
	}
	return p, nil
}

// turn hands over once: it returns the time from the release call to the
// waiter's return.
func (p *hoPair) turn(ctx context.Context) (time.Duration, error) {
	rel, wait := p.sides[p.holder], p.sides[1-p.holder]
	rel.cmds <- hoCmd{op: hoRelease, ctx: ctx}
	wait.cmds <- hoCmd{op: hoAwait, ctx: ctx}
	// The waiter's answer first: the driver must not wake up inside the
	// hand-off.
	w := <-wait.out
	r := <-rel.out
	if err := errors.Join(r.err, w.err); err != nil {
		return 0, err
	}
	p.holder = 1 - p.holder
	if w.at.Before(r.at) {
		return 0, errEarly
	}
	return w.at.Sub(r.at), nil
}

// close stops both sides (they release nothing: the lock is left to expire
// or to the client's close) and waits for them.
func (p *hoPair) close() {
	for _, r := range p.sides {
		close(r.cmds)
	}
	<-p.done
}

// handoffRound hands v over between two fresh clients for the span sp,
// after hoWarmUp hand-offs, and returns the hand-off times. With traced,
// each measured hand-off is a trace task (see handoff_trace.go).
func handoffRound(v hoVariant, srv *server, sp span, traced bool) ([]time.Duration, error) {
	var w wire
	p, err := newPair(v, srv.config(&w))
	if err != nil {
		return nil, err
	}
	defer p.close()
	bg := context.Background()
	for range hoWarmUp {
		if _, err := p.turn(bg); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	var lat []time.Duration
	for start := time.Now(); len(lat) == 0 || !sp.over(time.Since(start), len(lat)); {
		ctx, task := bg, (*trace.Task)(nil)
		if traced {
			ctx, task = trace.NewTask(bg, hoTraceTask)
		}
		d, err := p.turn(ctx)
		if task != nil {
			task.End()
		}
		if err != nil {
			return lat, err
		}
		lat = append(lat, d)
	}
	return lat, nil
}

// handoffResult is one variant's hand-offs over all rounds.
type handoffResult struct {
	Handoffs int
	P50, P90 time.Duration   // median over the rounds of each round's percentile
	AllP50   time.Duration   // over all hand-offs of all rounds
	AllP90   time.Duration   //
	Rounds   []time.Duration // each round's p50
	p90s     []time.Duration
	lat      []time.Duration
}

func (h *handoffResult) add(lat []time.Duration) {
	s := slices.Clone(lat)
	slices.Sort(s)
	h.Rounds = append(h.Rounds, percentile(s, 0.5))
	h.p90s = append(h.p90s, percentile(s, 0.9))
	h.lat = append(h.lat, lat...)
}

func (h *handoffResult) finish() {
	h.Handoffs = len(h.lat)
	h.P50, h.P90 = median(h.Rounds), median(h.p90s)
	slices.Sort(h.lat)
	h.AllP50, h.AllP90 = percentile(h.lat, 0.5), percentile(h.lat, 0.9)
	h.lat = nil
}

// handoffResults is the scenario: every variant's hand-offs, and the
// goroutine switches of the traced phase.
type handoffResults struct {
	Idle     time.Duration
	Variants []variantInfo
	Result   map[string]*handoffResult
	Switches []switchResult // remutex's and the floors', from a runtime trace
}

func (r *results) runHandoff(vs []variant, srv *server) {
	hvs := handoffVariants(vs)
	if r.Plan.Short {
		// Retries 50ms and more apart give a round of CI's short run one
		// hand-off or two, at a cost of seconds: the short run leaves them out.
		hvs = slices.DeleteFunc(hvs, func(v hoVariant) bool { return v.name == "redsync" || v.name == "redislock-100ms" })
	}
	h := &handoffResults{Idle: hoIdle, Result: map[string]*handoffResult{}}
	for _, v := range hvs {
		h.Variants = append(h.Variants, variantInfo{v.name, v.lib, v.setup, v.remutex})
		h.Result[v.name] = &handoffResult{}
	}
	r.Handoff = h
	for round := range max(1, r.Plan.HandoffRounds) {
		for _, v := range inTurn(hvs, round) {
			lat, err := handoffRound(v, srv, span{d: r.Plan.HandoffTime}, false)
			if errors.Is(err, errEarly) && !v.floor {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: handoff: %v (two holders at once)", v.name, err))
			}
			if err != nil {
				r.handoffProblem(v, err)
				continue
			}
			h.Result[v.name].add(lat)
		}
	}
	for _, v := range hvs {
		res := h.Result[v.name]
		if len(res.lat) == 0 {
			delete(h.Result, v.name)
			continue
		}
		res.finish()
		r.logf("handoff %-26s p50 %6.1fµs p90 %6.1fµs (%d)", v.name, us(res.P50), us(res.P90), res.Handoffs)
	}
	for _, v := range hvs {
		if !v.floor && v.lib != "remutex" {
			continue
		}
		sw, err := traceHandoffs(v, srv, r.Plan.HandoffTraced)
		if err != nil {
			r.handoffProblem(v, fmt.Errorf("traced: %w", err))
			continue
		}
		h.Switches = append(h.Switches, sw)
		r.logf("handoff traced %-26s switches: %s", v.name, sw.summary())
	}
}

// handoffProblem records a hand-off that failed: a violation for remutex, a
// problem for a peer or a floor.
func (r *results) handoffProblem(v hoVariant, err error) {
	r.problem(variant{name: v.name, remutex: v.remutex}, "handoff", err)
}

// handoffOf returns a variant's hand-off result.
func (r *results) handoffOf(name string) (*handoffResult, bool) {
	if r.Handoff == nil {
		return nil, false
	}
	h, ok := r.Handoff.Result[name]
	return h, ok && h.Handoffs > 0
}

// handoffTargets put remutex's hand-off beside the pub/sub floor's.
func (r *results) handoffTargets() []target {
	mine, ok1 := r.handoffOf(r.remutexName())
	floor, ok2 := r.handoffOf(hoFloor)
	if !ok1 || !ok2 {
		return nil
	}
	what := fmt.Sprintf("hand-off to a waiter idle %v: release call → the waiter's Lock returns, ", hoIdle)
	mk := func(q string, m, f time.Duration, limit float64) target {
		ratio := float64(m) / float64(f)
		return target{What: what + q, Goal: fmt.Sprintf("≤ %.2f× the pub/sub floor's %s", limit, q),
			Remutex: fmt.Sprintf("%.1f µs", us(m)), Peer: fmt.Sprintf("%.1f µs (%s)", us(f), hoFloor),
			Ratio: fmt.Sprintf("%.2f×", ratio), Known: true, Met: ratio <= limit}
	}
	ts := []target{mk("p50", mine.P50, floor.P50, 1.15), mk("p90", mine.P90, floor.P90, 1.25)}
	var sm, sf *switchResult
	for i := range r.Handoff.Switches {
		switch s := &r.Handoff.Switches[i]; s.Name {
		case r.remutexName():
			sm = s
		case hoFloor:
			sf = s
		}
	}
	if sm != nil && sf != nil {
		ts = append(ts, target{What: "hand-off: goroutine switches from the release call to the waiter's return (median per hand-off; releaser's side + waiter's side)",
			Goal: "reported", Remutex: sm.summary(), Peer: sf.summary() + " (" + hoFloor + ")"})
	}
	return ts
}

func (w *page) handoff(r *results) {
	h := r.Handoff
	if h == nil || len(h.Result) == 0 {
		return
	}
	floor, _ := r.handoffOf(hoFloor)
	w.p("## (i) Hand-off to an idle waiter\n\n")
	w.p("Two clients (separate connection pools) take turns on one lock: the holder releases once the other's Lock call has been waiting %v "+
		"(from the start of that call: its first attempt has failed long before, and its goroutines have gone idle); "+
		"the figure is the time from the start of the release call to the return of the waiter's Lock. Then the new holder releases to the first, "+
		"so both directions are measured. The floor: a PUBLISH on one client to a channel whose subscriber, a PubSub of the other client, "+
		"has been idle as long in ReceiveMessage on the receiving goroutine (as remutex's subscriber reads), from the PUBLISH call to ReceiveMessage's return; "+
		"beside it the same read through PubSub.Channel(). %d rounds of %v per variant, the variants and the floors rotated (each round beginning one further along), "+
		"each round on fresh clients after %d hand-offs of warm-up. *p50* and *p90* are the medians over the rounds of each round's percentile "+
		"(all rounds' p50 in brackets); *all* are over every hand-off together.\n\n",
		h.Idle, r.Plan.HandoffRounds, r.Plan.HandoffTime, hoWarmUp)
	w.p("| variant | hand-offs | p50 µs | p90 µs | × floor p50 | × floor p90 | all p50 µs | all p90 µs | rounds' p50 µs |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, v := range h.Variants {
		c, ok := r.handoffOf(v.Name)
		if !ok {
			w.p("| %s | failed ||||||||\n", v.Name)
			continue
		}
		x50, x90 := "", ""
		if floor != nil {
			x50 = fmt.Sprintf("%.2f", float64(c.P50)/float64(floor.P50))
			x90 = fmt.Sprintf("%.2f", float64(c.P90)/float64(floor.P90))
		}
		rounds := make([]string, len(c.Rounds))
		for i, d := range c.Rounds {
			rounds[i] = fmt.Sprintf("%.0f", us(d))
		}
		w.p("| %s | %d | %.1f | %.1f | %s | %s | %.1f | %.1f | %s |\n", bold(v.Name, v.Remutex), c.Handoffs, us(c.P50), us(c.P90), x50, x90,
			us(c.AllP50), us(c.AllP90), strings.Join(rounds, " "))
	}
	w.p("\n")
	w.switches(h)
}
