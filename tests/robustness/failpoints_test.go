package robustness

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
	"github.com/remutex/remutex/internal/scripts"
)

// Failpoints of the robustness test: what breaks. The nemesis injects one
// fault at a time, for a random time around the lease, and records each in
// the history. It goes through the kinds in rounds, each round in an order
// the seed shuffles, so that even a short run injects every kind.
//
// Plugging in more faults: a fault is a robustFailpoint; add it to
// robustFailpoints. Each Client reaches Redis through its robustLink: a
// FaultProxy (faults to chosen requests) in front of a Proxy (faults to
// every byte), both built in newRobustLink; a failpoint takes them from
// env.links[i].

// robustFailpoint is one kind of fault.
type robustFailpoint interface {
	name() string
	// inject starts the fault, choosing its target and size with r (dur is
	// how long it is meant to last), and returns what it did and the
	// function that ends it. The nemesis alone calls both.
	inject(env *robustEnv, r *rand.Rand, dur time.Duration) (what string, heal func(), err error)
}

// robustMayMiss is a failpoint that may find nothing to do (a request fault
// whose call no Client made while it lasted, a one-way cut of an idle
// direction): it fired only if it took something (env.fired).
type robustMayMiss interface{ mayMiss() }

func (delayFailpoint) mayMiss()     {}
func (dropReplyFailpoint) mayMiss() {}
func (duplicateFailpoint) mayMiss() {}
func (oneWayFailpoint) mayMiss()    {}

// unfired returns the kinds of fault that did nothing in the run.
func (env *robustEnv) unfired() []string {
	var out []string
	for _, fp := range env.failpoints {
		n := env.faults[fp.name()]
		if _, ok := fp.(robustMayMiss); ok {
			n = env.fired[fp.name()]
		}
		if n == 0 {
			out = append(out, fp.name())
		}
	}
	return out
}

// robustFailpoints are the faults the nemesis picks from.
var robustFailpoints = []robustFailpoint{
	pauseFailpoint{},
	pauseAllFailpoint{},
	latencyFailpoint{},
	blackholeFailpoint{},
	replyCutFailpoint{},
	restartFailpoint{},
	delayFailpoint{pastTimeout: false},
	delayFailpoint{pastTimeout: true},
	dropReplyFailpoint{},
	duplicateFailpoint{},
	oneWayFailpoint{dir: redistest.ClientToServer},
	oneWayFailpoint{dir: redistest.ServerToClient},
}

// robustLink is one Client's way to Redis: client → faults → proxy →
// redis-server. The two proxies are chained rather than one replacing the
// other: the Proxy's faults (a stall of both directions delivered late,
// latency on every reply, a blackhole that ends in broken connections, a
// restart behind it) stay as they were, latency has no FaultProxy
// counterpart, and the FaultProxy, in front, reads exactly the connections
// go-redis makes. A Duplicate's second copy goes through the Proxy too: a
// resend crosses the same network as the original.
type robustLink struct {
	faults *redistest.FaultProxy // the Client connects here
	proxy  *redistest.Proxy      // between faults and the server
	// readTimeout is how long the Client's go-redis waits for a reply
	// before it gives up on the connection (and, unless told not to, sends
	// the call again on another).
	readTimeout time.Duration
}

// addr is where the Client connects.
func (l *robustLink) addr() string { return l.faults.Addr() }

// heal ends every fault of the link: what the FaultProxy holds is
// delivered at once.
func (l *robustLink) heal() {
	l.faults.Heal()
	l.proxy.Resume()
	l.proxy.Heal()
}

// newRobustLink makes a Client's link to the server at target.
func newRobustLink(env *robustEnv, target string) *robustLink {
	p := redistest.NewProxy(env.t, target)
	// (Cleanups run in reverse: the FaultProxy closes before the Proxy.)
	return &robustLink{proxy: p, faults: redistest.NewFaultProxy(env.t, p.Addr())}
}

// robustServer is the lock server, which a failpoint kills and starts again
// on its port, empty.
type robustServer struct {
	bin, dir string
	port     int

	mu  sync.Mutex
	srv *redistest.Server // nil while killed
}

func (s *robustServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *robustServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv.Stop()
	s.srv = nil
}

// start starts the server again if it is killed; the port may linger a
// moment.
func (s *robustServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	var err error
	for try := 0; try < 100; try++ {
		if s.srv, err = redistest.LaunchOn(s.bin, s.dir, s.port); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("starting redis-server again on port %d: %w", s.port, err)
}

// pauseFailpoint holds one Client's bytes in both directions, then delivers
// them late: a network that stalls.
type pauseFailpoint struct{}

func (pauseFailpoint) name() string { return "pause" }
func (pauseFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	i := r.IntN(len(env.links))
	p := env.links[i].proxy
	p.Pause()
	return fmt.Sprintf("pause c%d for %v (bytes held, then delivered late)", i+1, dur), p.Resume, nil
}

// pauseAllFailpoint cuts Redis off from every Client at once.
type pauseAllFailpoint struct{}

func (pauseAllFailpoint) name() string { return "pause-all" }
func (pauseAllFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	for _, l := range env.links {
		l.proxy.Pause()
	}
	return fmt.Sprintf("pause every Client for %v", dur), func() {
		for _, l := range env.links {
			l.proxy.Resume()
		}
	}, nil
}

// latencyFailpoint delays what Redis sends one Client.
type latencyFailpoint struct{}

func (latencyFailpoint) name() string { return "latency" }
func (latencyFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	i := r.IntN(len(env.links))
	p := env.links[i].proxy
	d := env.lease/20 + time.Duration(r.Int64N(int64(env.lease*3/2)))
	p.SetLatency(d)
	return fmt.Sprintf("latency %v on replies to c%d for %v", d, i+1, dur), func() { p.SetLatency(0) }, nil
}

// blackholeFailpoint drops every byte of one Client, then breaks its
// connections so that it reconnects.
type blackholeFailpoint struct{}

func (blackholeFailpoint) name() string { return "blackhole" }
func (blackholeFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	i := r.IntN(len(env.links))
	p := env.links[i].proxy
	p.SetBlackhole(true)
	return fmt.Sprintf("blackhole c%d for %v", i+1, dur), p.Heal, nil
}

// replyCutFailpoint lets the next script call of one Client run and drops
// its reply (the connection closes).
type replyCutFailpoint struct{}

func (replyCutFailpoint) name() string { return "reply-cut" }
func (replyCutFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	i := r.IntN(len(env.links))
	env.links[i].proxy.CutReplyTo("evalsha")
	return fmt.Sprintf("cut the reply to c%d's next evalsha", i+1), func() {}, nil
}

// restartFailpoint kills redis-server and starts it again, empty, after dur.
type restartFailpoint struct{}

func (restartFailpoint) name() string { return "restart" }
func (restartFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	env.hist.Restarted()
	env.server.stop()
	return fmt.Sprintf("kill redis-server, start it again after %v", dur), func() {
		if err := env.server.start(); err != nil {
			env.hist.Violate("harness", "nemesis", "%v", err)
		}
	}, nil
}

// robustCall is a kind of lock call as it crosses the wire, for the faults
// that take chosen requests: an EVALSHA of a script by its SHA1, or a plain
// command by its name.
type robustCall struct {
	name string
	arg  string // what a matching request contains: the SHA1, or the command
	// once: a release, which the library sends without go-redis's retries
	// (it never sends one twice by itself).
	once bool
}

// robustCalls are the calls the request faults take, every kind of lock
// call that the traffic makes: the uncontended cycle, the full scripts of
// each lock, the wake-ups after an uncontended release, and the watchdog's
// renewal. (A call's first try after a restart is an EVAL, with the script's
// text instead of its SHA1; the EVALSHA before it is taken.)
var robustCalls = []robustCall{
	script("quick_lock", false),
	script("quick_rlock", false),
	script("quick_sem", false),
	{name: "hdel", arg: "hdel", once: true}, // a mutex's or a semaphore's uncontended release
	{name: "zrem", arg: "zrem", once: true}, // a reader's uncontended release
	script("wake", false),
	script("rwwake", false),
	script("sem_wake", false),
	script("acquire", false),
	script("release", true),
	script("leave", false),
	script("wlock", false),
	script("wunlock", true),
	script("rlock", false),
	script("runlock", true),
	script("rwleave", false), // the write and the read side's leave
	script("sem_acquire", false),
	script("sem_release", true),
	script("sem_leave", false),
	script("renew", false),
}

// script is the call of the entry script name of internal/scripts: the
// library sends each script as its source with the includes expanded
// (scripts.Source), by the SHA1 go-redis computes of it.
func script(name string, once bool) robustCall {
	return robustCall{name: name, arg: redis.NewScript(scripts.Source(name)).Hash(), once: once}
}

// requestFault arms, on every Client's link, a fault (made by arm) that
// takes the link's next request of one kind of call: the next of calls, in
// rounds that the seed shuffles, so that a run takes every kind. It returns
// the call and the function that ends the fault, which waits until a
// request was taken, window passed or the traffic stopped, so that calls
// the traffic makes rarely are taken too, and records what was taken. Each
// Client whose request of the call came before the end was hit.
func (env *robustEnv) requestFault(r *rand.Rand, kind string, calls []robustCall, window time.Duration,
	arm func(p *redistest.FaultProxy, m redistest.Match, l *robustLink) *redistest.Fault) (robustCall, func()) {
	if len(env.callRounds[kind]) == 0 {
		round := slices.Clone(calls)
		r.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		env.callRounds[kind] = round
	}
	c := env.callRounds[kind][0]
	env.callRounds[kind] = env.callRounds[kind][1:]
	faults := make([]*redistest.Fault, len(env.links))
	for i, l := range env.links {
		faults[i] = arm(l.faults, redistest.Match{Args: []string{c.arg}, Times: 1}, l)
	}
	until := time.Now().Add(window)
	return c, func() {
		took := make(chan struct{}, len(faults))
		quit := make(chan struct{})
		var wg sync.WaitGroup
		for _, f := range faults {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-f.Matched(1):
					took <- struct{}{}
				case <-quit:
				}
			}()
		}
		t := time.NewTimer(time.Until(until))
		select {
		case <-took:
		case <-t.C:
		case <-env.stop:
		}
		t.Stop()
		// Stop, not Heal: what a fault holds is delivered when it is due,
		// after the fault ended if need be.
		for _, f := range faults {
			f.Stop()
		}
		close(quit)
		wg.Wait()
		var by []string
		for i, f := range faults {
			if n, _ := f.Counts(); n > 0 {
				by = append(by, fmt.Sprintf("c%d", i+1))
			}
		}
		if len(by) == 0 {
			env.hist.Log("nemesis", "%s took no %s", kind, c.name)
			return
		}
		env.hist.Log("nemesis", "%s took a %s of %s", kind, c.name, strings.Join(by, ", "))
		env.fired[kind]++
		env.hits[c.name]++
	}
}

// delayFailpoint holds one Client's connection from a chosen call on, and
// delivers its requests late, in order: a stalled TCP connection whose
// segments arrive seconds later. Under the Client's read timeout the call
// waits for its late reply (unless its context ends first); past it
// (pastTimeout) go-redis gives up on the connection, sends the call again
// on another unless it is a release, and the held copy still arrives after
// the call returned, maybe after the goroutine's next acquisition.
type delayFailpoint struct{ pastTimeout bool }

func (f delayFailpoint) name() string {
	if f.pastTimeout {
		return "delay-past-timeout"
	}
	return "delay"
}

func (f delayFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	// Under the read timeout: a fifth to nine tenths of it; past it: by up
	// to 1.5s more.
	frac := 0.2 + 0.7*r.Float64()
	extra := 50*time.Millisecond + time.Duration(r.Int64N(int64(1500*time.Millisecond)))
	var ds []string
	c, heal := env.requestFault(r, f.name(), robustCalls, env.requestWindow(dur),
		func(p *redistest.FaultProxy, m redistest.Match, l *robustLink) *redistest.Fault {
			d := time.Duration(frac * float64(l.readTimeout))
			if f.pastTimeout {
				d = l.readTimeout + extra
			}
			d = d.Round(time.Millisecond)
			ds = append(ds, fmt.Sprintf("c%d's by %v (read timeout %v)", len(ds)+1, d, l.readTimeout))
			return p.Delay(m, d)
		})
	return fmt.Sprintf("hold a Client's connection from its next %s on, and deliver it late: %s",
		c.name, strings.Join(ds, ", ")), heal, nil
}

// requestWindow is how long a request fault waits for its request: at
// least dur, and a few leases.
func (env *robustEnv) requestWindow(dur time.Duration) time.Duration {
	return max(dur, 4*env.lease)
}

// dropReplyFailpoint lets Redis apply a chosen call of a Client and loses
// the reply: the connection goes silent until go-redis's read timeout
// (DropReply), or is closed (CutReply).
type dropReplyFailpoint struct{}

func (dropReplyFailpoint) name() string { return "drop-reply" }
func (dropReplyFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	cut := r.IntN(2) == 0
	c, heal := env.requestFault(r, "drop-reply", robustCalls, env.requestWindow(dur),
		func(p *redistest.FaultProxy, m redistest.Match, _ *robustLink) *redistest.Fault {
			if cut {
				return p.CutReply(m)
			}
			return p.DropReply(m)
		})
	how := "the connection goes silent"
	if cut {
		how = "the connection is closed"
	}
	return fmt.Sprintf("apply a Client's next %s and drop its reply: %s", c.name, how), heal, nil
}

// duplicateFailpoint delivers a chosen call of a Client a second time, on a
// connection of its own, at once or up to seconds later: a resend arriving
// beside (or long after) the original, as when go-redis gave up on a
// stalled connection whose bytes still arrive.
//
// Releases (release.lua and the like, the uncontended HDEL and ZREM) are
// never duplicated: the library sends them without retries, so neither
// go-redis nor TCP (which does not duplicate) ever delivers one twice, and a
// release that finds its hold gone by a copy it did not send rightly reports
// a loss that it cannot tell from a real one. Acquisitions, leaves, wake-ups
// and renewals are resent by go-redis, and must be safe to apply twice.
type duplicateFailpoint struct{}

// duplicable are the calls that go-redis may send twice.
var duplicable = func() []robustCall {
	var cs []robustCall
	for _, c := range robustCalls {
		if !c.once {
			cs = append(cs, c)
		}
	}
	return cs
}()

func (duplicateFailpoint) name() string { return "duplicate" }
func (duplicateFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	var d time.Duration
	if r.IntN(3) > 0 {
		d = time.Duration(r.Int64N(int64(2 * time.Second))).Round(time.Millisecond)
	}
	c, heal := env.requestFault(r, "duplicate", duplicable, env.requestWindow(dur),
		func(p *redistest.FaultProxy, m redistest.Match, _ *robustLink) *redistest.Fault {
			return p.Duplicate(m, d)
		})
	return fmt.Sprintf("send a Client's next %s again on another connection %v later", c.name, d), heal, nil
}

// oneWayFailpoint cuts one direction of one Client's connections, the other
// passing: requests or replies are held and delivered late (pause), or lost
// (blackhole, after which the connections that lost bytes are closed).
type oneWayFailpoint struct{ dir redistest.Direction }

func (f oneWayFailpoint) name() string {
	if f.dir == redistest.ClientToServer {
		return "cut-requests"
	}
	return "cut-replies"
}

func (f oneWayFailpoint) inject(env *robustEnv, r *rand.Rand, dur time.Duration) (string, func(), error) {
	i := r.IntN(len(env.links))
	p := env.links[i].faults
	way := "client→server"
	if f.dir == redistest.ServerToClient {
		way = "server→client"
	}
	if r.IntN(2) == 0 {
		fault := p.Pause(f.dir)
		return fmt.Sprintf("hold c%d's %s bytes for %v, then deliver them", i+1, way, dur), func() {
			fault.Stop()
			env.firedIf(f.name(), fault)
		}, nil
	}
	fault := p.Blackhole(f.dir)
	return fmt.Sprintf("drop c%d's %s bytes for %v", i+1, way, dur), func() {
		// Heal, not Stop: a stream that lost bytes in the middle of a
		// message (a subscription's are passed in chunks) must not be read
		// on; TCP never delivers one with holes. It also delivers at once
		// what a delay still holds on this link.
		p.Heal()
		env.firedIf(f.name(), fault)
	}, nil
}

// firedIf records that a fault of kind took requests or replies.
func (env *robustEnv) firedIf(kind string, f *redistest.Fault) {
	if n, _ := f.Counts(); n > 0 {
		env.fired[kind]++
	}
}

// nemesis injects faults until stop closes, then heals everything. The run
// owns it and joins it through done.
func (env *robustEnv) nemesis(r *rand.Rand, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer env.healAll()
	pause := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-stop:
			return false
		}
	}
	var round []robustFailpoint
	retried := map[string]bool{} // in this round
	for {
		gap := env.lease/10 + time.Duration(r.Int64N(int64(env.lease)))
		if !pause(gap) {
			return
		}
		if len(round) == 0 {
			round = slices.Clone(env.failpoints)
			r.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
			clear(retried)
		}
		fp := round[0]
		round = round[1:]
		fired := env.fired[fp.name()]
		// 0.2 to 2.5 leases: short ones that renewal rides out, long ones
		// that end holds.
		dur := env.lease/5 + time.Duration(r.Int64N(int64(env.lease*23/10)))
		what, heal, err := fp.inject(env, r, dur)
		if err != nil {
			env.hist.Violate("harness", "nemesis", "%s: %v", fp.name(), err)
			return
		}
		env.hist.Fault("nemesis", "fault %s: %s", fp.name(), what)
		env.faults[fp.name()]++
		ok := pause(dur)
		heal()
		env.hist.Log("nemesis", "healed %s", fp.name())
		if _, may := fp.(robustMayMiss); may && env.fired[fp.name()] == fired && !retried[fp.name()] {
			// It did nothing: once more in this round, on its next call.
			retried[fp.name()] = true
			round = append(round, fp)
		}
		if !ok {
			return
		}
	}
}

// healAll ends every fault: the server runs, every link passes bytes.
func (env *robustEnv) healAll() {
	if err := env.server.start(); err != nil {
		env.hist.Violate("harness", "nemesis", "%v", err)
	}
	for _, l := range env.links {
		l.heal()
	}
	env.hist.Log("nemesis", "healed everything")
}

// TestRobustCallsAreTheLibrarys: the SHA1s the request faults look for are
// those of scripts the library loads (Client.Check loads every one), so
// that a fault aimed at a call does take it.
func TestRobustCallsAreTheLibrarys(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := remutex.NewClient(rdb, remutex.WithLogger(slog.New(slog.DiscardHandler)))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	var shas []string
	for _, call := range robustCalls {
		if call.arg != call.name { // a script's, not a plain command's
			shas = append(shas, call.arg)
		}
	}
	loaded, err := rdb.ScriptExists(ctx, shas...).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range loaded {
		if !ok {
			t.Errorf("the SHA1 %s the faults take for a call is of no script the library loaded", shas[i])
		}
	}
}
