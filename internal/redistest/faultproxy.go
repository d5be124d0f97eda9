package redistest

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"
)

// FaultProxy passes TCP connections from a loopback port to a Redis server
// and does to chosen calls what a real network does to them: it delivers
// them late, twice, or never, and the late or second copy arrives on another
// connection than the client's next call uses. It reads what the client
// sends as RESP requests (a pipeline is several in one write) and what the
// server sends as replies, so that each fault takes the requests that match
// it (see Match), and does its work on their connection only:
//
//   - Delay holds a connection's requests from a matching one on, and
//     delivers them, in order, after a delay: a stalled TCP connection whose
//     segments arrive seconds later. The client may give up and close the
//     connection meanwhile; the server's side stays open until the held
//     requests were delivered and answered, then closes.
//   - DropReply and CutReply deliver a matching request and drop its reply
//     (and what follows it): the connection stays silent, or is closed.
//   - Duplicate delivers a matching request twice: the second copy on a
//     connection of the proxy's own, at once or after a delay.
//   - Pause and Blackhole hold or drop everything in one direction, on every
//     connection, until Heal.
//
// Each returns a *Fault, whose events a test awaits instead of sleeping.
// Heal ends every fault; Close, which NewFaultProxy registers as a cleanup,
// joins every goroutine of the proxy.
//
// Replies are told apart by counting (the i'th reply answers the i'th
// request), which holds until a connection subscribes (SUBSCRIBE and the
// like), sends MONITOR or CLIENT REPLY, or sends what is not RESP: from
// there on the connection's replies are not counted, DropReply and CutReply
// leave its requests alone, and a held request is done once delivered.
type FaultProxy struct {
	ln     net.Listener
	target string
	stop   chan struct{} // closed by Close: wakes a Duplicate's wait
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	links  map[*faultLink]struct{}
	faults []*Fault          // request faults, in the order armed
	dirs   [2]*Fault         // the Pause or Blackhole of each Direction
	extra  map[net.Conn]bool // a Duplicate's connections, closed by Close
}

// Direction is one way of a proxied connection.
type Direction int

const (
	// ClientToServer is what the client sends: its requests.
	ClientToServer Direction = iota
	// ServerToClient is what the server sends: its replies.
	ServerToClient
)

// Match says which requests a fault takes.
type Match struct {
	// Args are strings that a request must contain, each within one of its
	// arguments, ignoring ASCII case: a command name ("hdel"), a script's
	// SHA1, a key. A request matches when it contains them all; without
	// Args every request matches. (An EVAL's script text is an argument.)
	Args []string
	// Times is how many matching requests the fault takes; 0 means all of
	// them, until Stop or Heal.
	Times int
}

// Fault is a fault armed on a FaultProxy. Its events (Matched, Done) count
// the requests it took, and for a ServerToClient Pause or Blackhole the
// replies.
type Fault struct {
	p     *FaultProxy
	kind  faultKind
	args  [][]byte // Match.Args in lower case
	delay time.Duration
	dir   Direction

	// guarded by p.mu
	left    int // requests it may still take; negative: no limit
	stopped bool
	matched events
	done    events
}

type faultKind int

const (
	kindDelay faultKind = iota
	kindDropReply
	kindCutReply
	kindDuplicate
	kindPause
	kindBlackhole
)

// NewFaultProxy starts a fault proxy to target on 127.0.0.1. It is closed,
// and its goroutines joined, at the end of the test (after the cleanups
// registered later, such as those of the clients that use it).
func NewFaultProxy(t testing.TB, target string) *FaultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FaultProxy{ln: ln, target: target, stop: make(chan struct{}),
		links: make(map[*faultLink]struct{}), extra: make(map[net.Conn]bool)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the address clients connect to.
func (p *FaultProxy) Addr() string { return p.ln.Addr().String() }

// Delay holds the requests of a connection from one that m matches on, and
// delivers them to the server after d, in order, whether or not the client
// still has the connection open. Requests that match on a connection already
// held are held with it and counted, but start no hold of their own. Done
// counts the matching requests delivered and answered by the server.
func (p *FaultProxy) Delay(m Match, d time.Duration) *Fault {
	return p.arm(&Fault{kind: kindDelay, delay: d}, m)
}

// DropReply delivers the next request that m matches on a connection and
// drops its reply and everything the server sends after it: the client
// hears nothing more there. Done counts the replies dropped.
func (p *FaultProxy) DropReply(m Match) *Fault {
	return p.arm(&Fault{kind: kindDropReply}, m)
}

// CutReply is DropReply, but the connection is closed instead of its reply
// passed back, once the replies before it were: the request was applied and
// the client sees the connection break.
func (p *FaultProxy) CutReply(m Match) *Fault {
	return p.arm(&Fault{kind: kindCutReply}, m)
}

// Duplicate passes the requests m matches and sends each a second time,
// after d, on a connection of the proxy's own (after the AUTH, HELLO and
// SELECT its client's connection sent), whose replies are discarded: a
// resend that arrives beside the original. Done counts the copies the
// server answered.
func (p *FaultProxy) Duplicate(m Match, d time.Duration) *Fault {
	return p.arm(&Fault{kind: kindDuplicate, delay: d}, m)
}

// Pause holds everything sent in direction dir, on every connection, until
// Heal or Stop, which deliver it. Matched counts the requests (ServerToClient:
// replies) held; Done those delivered and (ClientToServer) answered.
func (p *FaultProxy) Pause(dir Direction) *Fault {
	return p.setDir(&Fault{kind: kindPause, dir: dir, left: -1})
}

// Blackhole drops everything sent in direction dir, on every connection,
// until Heal or Stop; Heal closes the connections that lost bytes, whose
// streams have holes. Matched and Done count what it dropped.
func (p *FaultProxy) Blackhole(dir Direction) *Fault {
	return p.setDir(&Fault{kind: kindBlackhole, dir: dir, left: -1})
}

// Heal ends every fault: what is held is delivered at once, nothing more is
// dropped, and the connections that lost a request or a reply are closed,
// so that their clients reconnect instead of reading a stream with holes.
func (p *FaultProxy) Heal() {
	p.mu.Lock()
	for _, f := range p.faults {
		f.stopped = true
	}
	p.faults = nil
	for i, f := range p.dirs {
		if f != nil {
			f.stopped = true
			p.dirs[i] = nil
		}
	}
	var broken []*faultLink
	for l := range p.links {
		l.holdUntil = time.Time{}
		for i := range l.up {
			l.up[i].due = time.Time{}
		}
		if l.holes || l.dropAt >= 0 {
			broken = append(broken, l)
		}
		l.signalLocked()
	}
	p.mu.Unlock()
	for _, l := range broken {
		l.teardown()
	}
}

// Close stops accepting, closes every connection (what is held is never
// delivered) and joins the proxy's goroutines. NewFaultProxy registers it as
// a cleanup.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
		_ = p.ln.Close()
	}
	links := make([]*faultLink, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	for c := range p.extra {
		_ = c.Close()
	}
	p.mu.Unlock()
	for _, l := range links {
		l.teardown()
	}
	p.wg.Wait()
}

// Matched returns a channel closed once the fault took n requests.
func (f *Fault) Matched(n int) <-chan struct{} {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.matched.await(n)
}

// Done returns a channel closed once the fault was done to n requests (see
// each fault for what that is).
func (f *Fault) Done(n int) <-chan struct{} {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.done.await(n)
}

// Counts returns how many requests the fault took and was done to so far,
// for a test's messages.
func (f *Fault) Counts() (matched, done int) {
	f.p.mu.Lock()
	defer f.p.mu.Unlock()
	return f.matched.n, f.done.n
}

// Stop makes the fault take nothing more. What it holds is still delivered
// as planned (a Pause's at once); a connection it left with holes stays open
// until Heal.
func (f *Fault) Stop() {
	p := f.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopLocked(f)
}

func (p *FaultProxy) stopLocked(f *Fault) {
	f.stopped = true
	for i, g := range p.faults {
		if g == f {
			p.faults = append(p.faults[:i], p.faults[i+1:]...)
			break
		}
	}
	if p.dirs[f.dir] == f {
		p.dirs[f.dir] = nil
		for l := range p.links {
			l.signalLocked()
		}
	}
}

func (p *FaultProxy) arm(f *Fault, m Match) *Fault {
	f.p, f.left = p, m.Times
	if m.Times <= 0 {
		f.left = -1
	}
	for _, a := range m.Args {
		f.args = append(f.args, bytes.ToLower([]byte(a)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = append(p.faults, f)
	return f
}

func (p *FaultProxy) setDir(f *Fault) *Fault {
	f.p = p
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.dirs[f.dir]; old != nil {
		p.stopLocked(old)
	}
	p.dirs[f.dir] = f
	return f
}

// pausedLocked reports whether direction dir is paused.
func (p *FaultProxy) pausedLocked(dir Direction) bool {
	f := p.dirs[dir]
	return f != nil && f.kind == kindPause
}

// blackholeLocked returns the Blackhole of direction dir, or nil.
func (p *FaultProxy) blackholeLocked(dir Direction) *Fault {
	if f := p.dirs[dir]; f != nil && f.kind == kindBlackhole {
		return f
	}
	return nil
}

// wantsLocked reports whether f takes a request with these arguments.
func (f *Fault) wantsLocked(args [][]byte) bool {
	if f.stopped || f.left == 0 {
		return false
	}
	for _, want := range f.args {
		found := false
		for _, a := range args {
			if containsFold(a, want) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// tookLocked counts a request f took.
func (f *Fault) tookLocked() {
	if f.left > 0 {
		f.left--
	}
	f.matched.add()
}

// events counts something that happens and wakes those who wait for a
// count. Guarded by the proxy's mutex.
type events struct {
	n       int
	waiters []eventWaiter
}

type eventWaiter struct {
	n  int
	ch chan struct{}
}

func (e *events) add() {
	e.n++
	kept := e.waiters[:0]
	for _, w := range e.waiters {
		if e.n >= w.n {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	clear(e.waiters[len(kept):])
	e.waiters = kept
}

func (e *events) await(n int) <-chan struct{} {
	ch := make(chan struct{})
	if e.n >= n {
		close(ch)
		return ch
	}
	e.waiters = append(e.waiters, eventWaiter{n: n, ch: ch})
	return ch
}
