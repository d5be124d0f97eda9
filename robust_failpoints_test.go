package remutex

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// Failpoints of the robustness test: what breaks. The nemesis injects one
// fault at a time, for a random time around the lease, and records each in
// the history.
//
// Plugging in more faults: a fault is a robustFailpoint; add it to
// robustFailpoints. Each Client reaches Redis through its robustLink; a
// proxy with more faults (delay a connection's bytes, duplicate, execute but
// drop the reply, one direction) is built in newRobustLink, chained in front
// of (or instead of) the Proxy there, and its failpoints take it from
// env.links[i].

// robustFailpoint is one kind of fault.
type robustFailpoint interface {
	name() string
	// inject starts the fault, choosing its target and size with r (dur is
	// how long it is meant to last), and returns what it did and the
	// function that ends it.
	inject(env *robustEnv, r *rand.Rand, dur time.Duration) (what string, heal func(), err error)
}

// robustFailpoints are the faults the nemesis picks from.
var robustFailpoints = []robustFailpoint{
	pauseFailpoint{},
	pauseAllFailpoint{},
	latencyFailpoint{},
	blackholeFailpoint{},
	replyCutFailpoint{},
	restartFailpoint{},
}

// robustLink is one Client's way to Redis.
type robustLink struct {
	proxy *redistest.Proxy
}

// addr is where the Client connects.
func (l *robustLink) addr() string { return l.proxy.Addr() }

// heal ends every fault of the link.
func (l *robustLink) heal() {
	l.proxy.Resume()
	l.proxy.Heal()
}

// newRobustLink makes a Client's link to the server at target.
func newRobustLink(env *robustEnv, target string) *robustLink {
	return &robustLink{proxy: redistest.NewProxy(env.t, target)}
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
	env.hist.restarted()
	env.server.stop()
	return fmt.Sprintf("kill redis-server, start it again after %v", dur), func() {
		if err := env.server.start(); err != nil {
			env.hist.violation("harness", "nemesis", "%v", err)
		}
	}, nil
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
	for {
		gap := env.lease/10 + time.Duration(r.Int64N(int64(env.lease)))
		if !pause(gap) {
			return
		}
		fp := env.failpoints[r.IntN(len(env.failpoints))]
		// 0.2 to 2.5 leases: short ones that renewal rides out, long ones
		// that end holds.
		dur := env.lease/5 + time.Duration(r.Int64N(int64(env.lease*23/10)))
		what, heal, err := fp.inject(env, r, dur)
		if err != nil {
			env.hist.violation("harness", "nemesis", "%s: %v", fp.name(), err)
			return
		}
		env.hist.log("nemesis", "fault %s: %s", fp.name(), what)
		env.faults[fp.name()]++
		ok := pause(dur)
		heal()
		env.hist.log("nemesis", "healed %s", fp.name())
		if !ok {
			return
		}
	}
}

// healAll ends every fault: the server runs, every link passes bytes.
func (env *robustEnv) healAll() {
	if err := env.server.start(); err != nil {
		env.hist.violation("harness", "nemesis", "%v", err)
	}
	for _, l := range env.links {
		l.heal()
	}
	env.hist.log("nemesis", "healed everything")
}
