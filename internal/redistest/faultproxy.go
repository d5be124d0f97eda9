package redistest

import (
	"bytes"
	"net"
	"strconv"
	"strings"
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

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		cc, err := p.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = cc.Close()
			continue
		}
		l := &faultLink{p: p, client: cc, server: sc, gone: make(chan struct{}),
			changed: make(chan struct{}), dropAt: -1, stopCount: -1, onReply: make(map[int][]*Fault)}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = cc.Close()
			_ = sc.Close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(4)
		p.mu.Unlock()
		go l.readUp()
		go l.writeUp()
		go l.readDown()
		go l.writeDown()
	}
}

// faultLink is one proxied connection. Four goroutines serve it: a reader
// and a writer each way, joined by a queue, so that bytes can be held
// without stopping the reads.
type faultLink struct {
	p              *FaultProxy
	client, server net.Conn
	gone           chan struct{} // closed when the link is torn down
	once           sync.Once

	// guarded by p.mu
	changed   chan struct{} // closed and replaced on every change the writers wait for
	up, down  []segment     // read, not written yet
	clientEOF bool          // the client closed its side (or it failed)
	deaf      bool          // writing to the client failed: what comes for it is dropped
	cut       bool          // a CutReply: close the link once the replies before the cut are written
	holdUntil time.Time     // a Delay holds what the client sends until then
	opaque    bool          // the client sent what is not RESP: passed on as it is
	requests  int           // requests read from the client
	written   int           // requests written to the server
	replies   int           // replies read from the server
	stopCount int           // the request from which replies are not counted; -1: all are
	setup     [][]byte      // AUTH, HELLO and SELECT requests, for a Duplicate's connection
	dropAt    int           // the reply from which on everything is dropped; -1 none
	dropBy    *Fault
	dropping  bool             // replies are being dropped (dropAt reached)
	holes     bool             // bytes were dropped: Heal closes the link
	onReply   map[int][]*Fault // request → the faults done once its reply came
	sent      []*Fault         // the faults done by the write under way (replies not counted)
}

// segment is one request (or, server to client, one reply; or bytes that
// are neither) in a link's queue.
type segment struct {
	b       []byte
	due     time.Time // not written before
	req     int       // the request's number; -1 for none
	waiting []*Fault  // the faults done once it was delivered (and answered)
	paused  *Fault    // the Pause that held it
}

func (l *faultLink) signalLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// countedLocked reports whether the reply to request i is counted.
func (l *faultLink) countedLocked(i int) bool {
	return l.stopCount < 0 || i < l.stopCount
}

func (l *faultLink) stopCountingLocked(from int) {
	if l.stopCount < 0 || from < l.stopCount {
		l.stopCount = from
	}
}

// teardown closes both connections and ends the link's goroutines.
func (l *faultLink) teardown() {
	l.once.Do(func() {
		close(l.gone)
		_ = l.client.Close()
		_ = l.server.Close()
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	})
}

// readUp reads the client's requests and queues them, faults applied.
func (l *faultLink) readUp() {
	defer l.p.wg.Done()
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			pending = l.fromClient(append(pending, buf[:n]...))
		}
		if err != nil {
			l.p.mu.Lock()
			l.clientEOF = true
			l.signalLocked()
			l.p.mu.Unlock()
			return
		}
	}
}

// fromClient queues the complete requests at the start of b and returns
// the rest.
func (l *faultLink) fromClient(b []byte) []byte {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for len(b) > 0 {
		args, n, ok := parseRequest(b)
		if !ok || l.opaque {
			// Not RESP: passed on as it is, and nothing is counted any more.
			l.opaque = true
			l.stopCountingLocked(l.requests)
			l.queueUpLocked(segment{b: bytes.Clone(b), req: -1}, now)
			return nil
		}
		if n == 0 {
			break
		}
		req := bytes.Clone(b[:n])
		if len(args) == 0 { // an empty line or array: Redis does not answer it
			l.queueUpLocked(segment{b: req, req: -1}, now)
		} else {
			l.requestLocked(args, req, now)
		}
		b = b[n:]
	}
	return bytes.Clone(b)
}

// requestLocked applies the faults to one request and queues it.
func (l *faultLink) requestLocked(args [][]byte, b []byte, now time.Time) {
	p := l.p
	i := l.requests
	l.requests++
	switch cmd := string(bytes.ToLower(args[0])); {
	case cmd == "auth" || cmd == "hello" || cmd == "select":
		l.setup = append(l.setup, b)
	case cmd == "monitor" || strings.HasSuffix(cmd, "subscribe") ||
		cmd == "client" && len(args) > 1 && bytes.EqualFold(args[1], []byte("reply")):
		l.stopCountingLocked(i)
	}
	if f := p.blackholeLocked(ClientToServer); f != nil {
		f.matched.add()
		f.done.add()
		l.holes = true
		l.stopCountingLocked(i) // its reply never comes: the rest do not line up
		return
	}
	seg := segment{b: b, req: i}
	for _, f := range p.faults {
		if !f.wantsLocked(args) {
			continue
		}
		switch f.kind {
		case kindDelay:
			if !now.Before(l.holdUntil) {
				l.holdUntil = now.Add(f.delay)
			}
			seg.waiting = append(seg.waiting, f)
		case kindDropReply, kindCutReply:
			if l.dropAt >= 0 || !l.countedLocked(i) {
				continue // dropping already, or its reply cannot be told apart
			}
			l.dropAt, l.dropBy = i, f
		case kindDuplicate:
			p.duplicateLocked(f, l.setup, b, now.Add(f.delay))
		}
		f.tookLocked()
	}
	if f := p.dirs[ClientToServer]; f != nil && f.kind == kindPause {
		f.matched.add()
		seg.paused = f
		seg.waiting = append(seg.waiting, f)
	}
	l.queueUpLocked(seg, now)
}

func (l *faultLink) queueUpLocked(seg segment, now time.Time) {
	if now.Before(l.holdUntil) {
		seg.due = l.holdUntil
	}
	l.up = append(l.up, seg)
	l.signalLocked()
}

// writeUp writes the queued requests to the server, each once it is due and
// the direction is not paused. Once the client closed its side and every
// request was delivered and answered, it closes the link.
func (l *faultLink) writeUp() {
	defer l.p.wg.Done()
	for {
		out, wait, changed, end := l.nextUp(time.Now())
		switch {
		case end:
			l.teardown()
			return
		case len(out) > 0:
			if _, err := l.server.Write(out); err != nil {
				l.teardown()
				return
			}
			l.delivered()
		case !l.sleep(changed, wait):
			return
		}
	}
}

// nextUp takes what is due to be written: the bytes, or else how long until
// the next is due (0: until something changes); end once the link is done.
func (l *faultLink) nextUp(now time.Time) (out []byte, wait time.Duration, changed <-chan struct{}, end bool) {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = l.changed
	if p.pausedLocked(ClientToServer) {
		return nil, 0, changed, false
	}
	n := 0
	for _, s := range l.up {
		if s.due.After(now) {
			wait = s.due.Sub(now)
			break
		}
		out = append(out, s.b...)
		if s.req >= 0 {
			l.written = s.req + 1
			if l.countedLocked(s.req) {
				l.onReply[s.req] = s.waiting
			} else {
				l.sent = append(l.sent, s.waiting...)
			}
		}
		n++
	}
	clear(l.up[:n])
	l.up = l.up[n:]
	answered := l.replies >= l.written || !l.countedLocked(l.replies)
	end = len(out) == 0 && len(l.up) == 0 && l.clientEOF && answered
	return out, wait, changed, end
}

// delivered counts the faults done by the delivery of requests whose
// replies are not counted.
func (l *faultLink) delivered() {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	for _, f := range l.sent {
		f.done.add()
	}
	l.sent = l.sent[:0]
}

// sleep waits for a change, for wait if not 0, or the link's end; false at
// the end.
func (l *faultLink) sleep(changed <-chan struct{}, wait time.Duration) bool {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-changed:
	case <-timeout:
	case <-l.gone:
		return false
	}
	return true
}

// readDown reads the server's replies and queues them, faults applied.
func (l *faultLink) readDown() {
	defer l.p.wg.Done()
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := l.server.Read(buf)
		if n > 0 {
			pending = l.fromServer(append(pending, buf[:n]...))
		}
		if err != nil {
			l.teardown()
			return
		}
	}
}

// fromServer queues the complete replies at the start of b and returns the
// rest. Where replies are not counted it queues b as it is.
func (l *faultLink) fromServer(b []byte) []byte {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(b) > 0 {
		if !l.countedLocked(l.replies) {
			l.replyLocked(bytes.Clone(b), -1)
			return nil
		}
		n, ok := replyLen(b)
		if !ok {
			l.stopCountingLocked(l.replies)
			continue
		}
		if n == 0 {
			break
		}
		i := -1
		if b[0] != '>' { // a push is no reply
			i = l.replies
			l.replies++
			for _, f := range l.onReply[i] {
				f.done.add()
			}
			delete(l.onReply, i)
			l.signalLocked()
		}
		l.replyLocked(bytes.Clone(b[:n]), i)
		b = b[n:]
	}
	return bytes.Clone(b)
}

// replyLocked queues reply i (-1: bytes that are no reply), or drops it.
func (l *faultLink) replyLocked(b []byte, i int) {
	p := l.p
	if !l.dropping && l.dropAt >= 0 && i >= l.dropAt {
		l.dropping = true
		l.dropBy.done.add()
		l.cut = l.dropBy.kind == kindCutReply
	}
	if l.dropping || l.deaf {
		l.holes = l.holes || l.dropping
		l.signalLocked()
		return
	}
	if f := p.blackholeLocked(ServerToClient); f != nil {
		f.matched.add()
		f.done.add()
		l.holes = true
		return
	}
	seg := segment{b: b, req: i}
	if f := p.dirs[ServerToClient]; f != nil && f.kind == kindPause {
		f.matched.add()
		seg.paused = f
	}
	l.down = append(l.down, seg)
	l.signalLocked()
}

// writeDown writes the queued replies to the client while the direction is
// not paused; after a CutReply, it closes the link once they are written.
func (l *faultLink) writeDown() {
	defer l.p.wg.Done()
	for {
		out, late, cut, changed := l.nextDown()
		if len(out) == 0 {
			if cut {
				l.teardown()
				return
			}
			if !l.sleep(changed, 0) {
				return
			}
			continue
		}
		_, err := l.client.Write(out)
		l.p.mu.Lock()
		for _, f := range late {
			f.done.add()
		}
		if err != nil {
			l.deaf = true // the client is gone; its held requests may not be
			l.down = nil
		}
		l.p.mu.Unlock()
	}
}

// nextDown takes the queued replies unless the direction is paused, with
// the Pauses that held them.
func (l *faultLink) nextDown() (out []byte, late []*Fault, cut bool, changed <-chan struct{}) {
	p := l.p
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = l.changed
	if p.pausedLocked(ServerToClient) {
		return nil, nil, false, changed
	}
	for _, s := range l.down {
		out = append(out, s.b...)
		if s.paused != nil {
			late = append(late, s.paused)
		}
	}
	clear(l.down)
	l.down = l.down[:0]
	return out, late, l.cut, changed
}

// duplicateLocked sends setup and req on a connection of the proxy's own
// at at, and counts f done once the server answered them all.
func (p *FaultProxy) duplicateLocked(f *Fault, setup [][]byte, req []byte, at time.Time) {
	if p.closed {
		return
	}
	msg := bytes.Join(append(append([][]byte(nil), setup...), req), nil)
	replies := len(setup) + 1
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if p.resend(msg, replies, at) {
			p.mu.Lock()
			f.done.add()
			p.mu.Unlock()
		}
	}()
}

// resend is a Duplicate's second copy: it waits until at, sends msg on a
// new connection and reads the replies; true once they all came.
func (p *FaultProxy) resend(msg []byte, replies int, at time.Time) bool {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.stop:
		return false
	}
	conn, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return false
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = conn.Close()
		return false
	}
	p.extra[conn] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.extra, conn)
		p.mu.Unlock()
		_ = conn.Close()
	}()
	_ = conn.SetDeadline(time.Now().Add(hangGuard))
	if _, err := conn.Write(msg); err != nil {
		return false
	}
	var got []byte
	buf := make([]byte, 4<<10)
	for replies > 0 {
		n, ok := replyLen(got)
		switch {
		case !ok:
			return false
		case n > 0:
			if got[0] != '>' {
				replies--
			}
			got = got[n:]
			continue
		}
		k, err := conn.Read(buf)
		got = append(got, buf[:k]...)
		if err != nil && k == 0 {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------- RESP

var crlf = []byte("\r\n")

// parseRequest parses the request at the start of b: a RESP array of bulk
// strings, or an inline command (a line of words). It returns its arguments
// (none for an empty one) and its length; n is 0 when b holds only part of
// it, and ok false when b does not start with a request.
func parseRequest(b []byte) (args [][]byte, n int, ok bool) {
	if len(b) == 0 {
		return nil, 0, true
	}
	if b[0] != '*' {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil, 0, len(b) < 64<<10
		}
		return bytes.Fields(b[:i]), i + 1, true
	}
	count, i, ok := intLine(b, 1)
	if !ok || i == 0 || count <= 0 {
		return nil, i, ok
	}
	args = make([][]byte, 0, min(count, 64))
	for range count {
		if i >= len(b) {
			return nil, 0, true
		}
		if b[i] != '$' {
			return nil, 0, false
		}
		size, j, ok := intLine(b, i+1)
		switch {
		case !ok || size < 0:
			return nil, 0, false
		case j == 0 || j+size+2 > len(b):
			return nil, 0, true
		case !bytes.Equal(b[j+size:j+size+2], crlf):
			return nil, 0, false
		}
		args = append(args, b[j:j+size])
		i = j + size + 2
	}
	return args, i, true
}

// replyLen returns the length of the RESP2 or RESP3 value at the start of b
// (an attribute together with the value it describes); 0 when b holds only
// part of it, and ok false when b does not start with one.
func replyLen(b []byte) (n int, ok bool) { return valueEnd(b, 0, 0) }

func valueEnd(b []byte, i, depth int) (end int, ok bool) {
	if i >= len(b) {
		return 0, true
	}
	if depth > 64 {
		return 0, false
	}
	switch b[i] {
	case '+', '-', ':', '_', ',', '#', '(':
		j := bytes.Index(b[i:], crlf)
		if j < 0 {
			return 0, true
		}
		return i + j + 2, true
	case '$', '!', '=':
		size, j, ok := intLine(b, i+1)
		switch {
		case !ok || j == 0:
			return 0, ok
		case size < 0:
			return j, true
		case j+size+2 > len(b):
			return 0, true
		}
		return j + size + 2, true
	case '*', '~', '>', '%', '|':
		count, j, ok := intLine(b, i+1)
		if !ok || j == 0 || count < 0 {
			return j, ok
		}
		if b[i] == '%' || b[i] == '|' {
			count *= 2
		}
		for range count {
			if j, ok = valueEnd(b, j, depth+1); !ok || j == 0 {
				return 0, ok
			}
		}
		if b[i] == '|' {
			return valueEnd(b, j, depth+1)
		}
		return j, true
	}
	return 0, false
}

// intLine parses the integer from b[i] to the end of its line: its value
// and where the next line starts; next is 0 when the line is not complete,
// ok false when it is no integer.
func intLine(b []byte, i int) (v, next int, ok bool) {
	j := bytes.Index(b[i:], crlf)
	if j < 0 {
		return 0, 0, len(b)-i < 32
	}
	v, err := strconv.Atoi(string(b[i : i+j]))
	if err != nil {
		return 0, 0, false
	}
	return v, i + j + 2, true
}

// containsFold reports whether s contains lower, which is in lower case,
// ignoring ASCII case.
func containsFold(s, lower []byte) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		match := true
		for j, c := range lower {
			d := s[i+j]
			if 'A' <= d && d <= 'Z' {
				d += 'a' - 'A'
			}
			if d != c {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}
