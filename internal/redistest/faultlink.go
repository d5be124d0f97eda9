package redistest

import (
	"bytes"
	"net"
	"strings"
	"sync"
	"time"
)

// The connections of a FaultProxy: each is a faultLink, served by four
// goroutines; a Duplicate's second copy is sent by one more.

// accept dials the server for each connection it accepts and starts the
// link's goroutines.
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
