package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy passes TCP connections from a loopback port to a target (a Redis
// server) and does faults to them: it can hold every byte (Pause, as a
// network that stopped delivering, without closing anything), drop every
// byte (SetBlackhole), delay what the server sends (SetLatency), and close a
// connection right after the server answered a chosen request, so that the
// request was applied but its reply never arrives (CutReplyTo).
type Proxy struct {
	ln        net.Listener
	target    string
	latency   atomic.Int64 // server-to-client delay in ns
	blackhole atomic.Bool

	mu      sync.Mutex
	gate    chan struct{} // closed while bytes pass; open while paused
	closed  bool
	links   map[*link]struct{}
	pattern []byte // a request containing it has its reply cut
	armed   int    // how many more requests to cut
	cuts    int    // replies cut so far
	wg      sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	cutReply       atomic.Bool
	once           sync.Once
	done           chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// NewProxy starts a proxy to target on 127.0.0.1. It is closed, and its
// goroutines joined, at the end of the test (after the cleanups registered
// later, such as those of the clients that use it).
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, gate: make(chan struct{}), links: make(map[*link]struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pause stops passing bytes in both directions: they are read and held.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // paused already
	}
}

// Resume passes bytes again, those held first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// SetBlackhole drops every byte, in both directions, while on.
func (p *Proxy) SetBlackhole(on bool) { p.blackhole.Store(on) }

// SetLatency delays every chunk the server sends by d.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// Heal ends blackholing and latency and closes every connection, so that
// the clients that lost bytes reconnect instead of reading a stream with
// holes.
func (p *Proxy) Heal() {
	p.blackhole.Store(false)
	p.latency.Store(0)
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.close()
	}
}

// CutReplyTo makes the proxy pass the next request containing pattern to
// the server and then close that connection instead of passing the reply
// back.
func (p *Proxy) CutReplyTo(pattern string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pattern, p.armed = []byte(pattern), 1
}

// ReplyCuts returns how many replies were cut so far.
func (p *Proxy) ReplyCuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Close stops accepting, closes every connection and joins the proxy's
// goroutines. NewProxy registers it as a cleanup.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	_ = p.ln.Close()
	for l := range p.links {
		l.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
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
		l := &link{client: cc, server: sc, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, cc, sc, true)
		go p.pump(l, sc, cc, false)
	}
}

// chunk is bytes read, to be written at due or later.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst (up: client to server) through a queue, so that
// chunks can be held back without stopping the reads. Its writer goroutine
// is joined before it returns.
func (p *Proxy) pump(l *link, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	queue := make(chan chunk, 1024)
	written := make(chan struct{})
	go func() {
		defer close(written)
		p.write(l, dst, queue)
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.pass(l, queue, append([]byte(nil), buf[:n]...), up) {
			break
		}
		if err != nil {
			break
		}
	}
	close(queue)
	<-written
}

// pass applies the faults to b, read in direction up, and queues what is to
// be written; false when the link is to be closed.
func (p *Proxy) pass(l *link, queue chan<- chunk, b []byte, up bool) bool {
	if up {
		p.inspect(l, b)
	} else if l.cutReply.Load() {
		p.mu.Lock()
		p.cuts++
		p.mu.Unlock()
		return false
	}
	if p.blackhole.Load() {
		return true
	}
	c := chunk{b: b}
	if !up {
		c.due = time.Now().Add(time.Duration(p.latency.Load()))
	}
	select {
	case queue <- c:
		return true
	case <-l.done:
		return false
	}
}

// write writes the queued chunks to dst, each when it is due and the proxy
// is not paused, until the queue closes or the link does.
func (p *Proxy) write(l *link, dst net.Conn, queue <-chan chunk) {
	for c := range queue {
		if d := time.Until(c.due); d > 0 {
			timer := time.NewTimer(d)
			select {
			case <-timer.C:
			case <-l.done:
				timer.Stop()
				return
			}
		}
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		select {
		case <-gate:
		case <-l.done:
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.close()
			return
		}
	}
}

// inspect arms l to cut its next reply if b is the request CutReplyTo waits
// for.
func (p *Proxy) inspect(l *link, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed > 0 && bytes.Contains(b, p.pattern) {
		p.armed--
		l.cutReply.Store(true)
	}
}
