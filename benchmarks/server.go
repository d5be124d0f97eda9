package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// server is the Redis the benchmarks run on: a redis-server child process on
// 127.0.0.1 that the program started (with the tests' harness,
// internal/redistest), or the one REDIS_ADDR names.
type server struct {
	addr string
	srv  *redistest.Server // nil for REDIS_ADDR and under callgrind
	cg   *callgrind        // redis-server run by callgrind (see callgrind.go), or nil
	info *redis.Client     // for INFO, on a connection of its own
}

// serverSet is the servers running, for the interrupt and the timeout to
// stop.
type serverSet struct {
	mu  sync.Mutex
	all []*server
}

func (ss *serverSet) add(s *server) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.all = append(ss.all, s)
}

func (ss *serverSet) remove(s *server) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.all = slices.DeleteFunc(ss.all, func(t *server) bool { return t == s })
}

func (ss *serverSet) stopAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.all {
		s.stop()
	}
}

// startServer starts redis-server without persistence on a free loopback
// port, or connects to REDIS_ADDR when it is set.
func startServer() (*server, error) {
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		s := &server{addr: addr}
		return s, s.connect(time.Second)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not on PATH (apt-get install redis-server) and REDIS_ADDR not set: %w", err)
	}
	dir, err := os.MkdirTemp("", "remutex-bench-redis-")
	if err != nil {
		return nil, err
	}
	srv, err := redistest.Launch(bin, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &server{addr: srv.Addr(), srv: srv}
	if err := s.connect(time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// connect opens the connection for INFO, waiting up to timeout for PING.
func (s *server) connect(timeout time.Duration) error {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1, ReadTimeout: timeout, WriteTimeout: timeout})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return err
	}
	s.info = rdb
	return nil
}

// stop ends the child process (if any) and removes its directory.
func (s *server) stop() {
	if s.info != nil {
		_ = s.info.Close()
		s.info = nil
	}
	if s.srv != nil {
		s.srv.Stop()
		_ = os.RemoveAll(s.srv.Dir())
		s.srv = nil
	}
	if s.cg != nil {
		s.cg.stop()
	}
}

// config is what a scenario's clients on s are given: on a server slowed
// down by callgrind, long timeouts and, where it dumps after every script
// call, the log that names those calls.
func (s *server) config(w *wire) config {
	cfg := config{addr: s.addr, wire: w}
	if s.cg != nil {
		cfg.slow, cfg.scripts = true, s.cg.log
	}
	return cfg
}

// version returns the server's redis_version.
func (s *server) version() string {
	f, err := s.infoFields("server")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return f["redis_version"]
}

func (s *server) infoFields(section string) (map[string]string, error) {
	txt, err := s.info.Info(context.Background(), section).Result()
	if err != nil {
		return nil, err
	}
	f := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			f[k] = v
		}
	}
	return f, nil
}

// usage is what the server has done so far: its CPU time (user+sys, INFO
// cpu) and, per command, the calls it executed and the time they took (INFO
// commandstats; commands run inside scripts count too).
type usage struct {
	cpu  time.Duration
	cmds map[string]cmdStat
}

type cmdStat struct {
	Calls int64
	Usec  int64
}

func (s *server) usage() usage {
	u := usage{cmds: map[string]cmdStat{}}
	all, err := s.infoFields("all")
	if err != nil {
		fmt.Fprintln(os.Stderr, "INFO:", err)
		return u
	}
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		if f, err := strconv.ParseFloat(all[k], 64); err == nil {
			u.cpu += time.Duration(f * float64(time.Second))
		}
	}
	for k, v := range all {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(v, ",") {
			f, val, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(val, 10, 64)
			switch f {
			case "calls":
				st.Calls = n
			case "usec":
				st.Usec = n
			}
		}
		u.cmds[name] = st
	}
	return u
}

// sub returns what happened between v and u, less the INFO call that read u.
func (u usage) sub(v usage) usage {
	d := usage{cpu: u.cpu - v.cpu, cmds: map[string]cmdStat{}}
	for k, a := range u.cmds {
		b := v.cmds[k]
		if k == "info" {
			a.Calls--
		}
		if a.Calls != b.Calls {
			d.cmds[k] = cmdStat{a.Calls - b.Calls, a.Usec - b.Usec}
		}
	}
	return d
}

// add sums two deltas.
func (u usage) add(v usage) usage {
	d := usage{cpu: u.cpu + v.cpu, cmds: map[string]cmdStat{}}
	for k, a := range u.cmds {
		d.cmds[k] = a
	}
	for k, b := range v.cmds {
		a := d.cmds[k]
		d.cmds[k] = cmdStat{a.Calls + b.Calls, a.Usec + b.Usec}
	}
	return d
}

// executed is the number of commands the server ran, scripts' included.
func (u usage) executed() int64 {
	var n int64
	for _, st := range u.cmds {
		n += st.Calls
	}
	return n
}

// wire counts what a client sends on its sockets. A burst is a run of writes
// with no read in between: one command sent and answered, or one pipeline,
// whatever its size: a round trip. For a client that reads and writes on
// separate goroutines (rueidis) bursts are its flushes, which is what round
// trips become under auto-pipelining. Commands are counted by parsing the
// RESP arrays written.
type wire struct {
	bursts   atomic.Int64
	commands atomic.Int64
	bytes    atomic.Int64
}

type wireSnapshot struct{ Bursts, Commands, Bytes int64 }

func (w *wire) snapshot() wireSnapshot {
	return wireSnapshot{w.bursts.Load(), w.commands.Load(), w.bytes.Load()}
}

func (a wireSnapshot) sub(b wireSnapshot) wireSnapshot {
	return wireSnapshot{a.Bursts - b.Bursts, a.Commands - b.Commands, a.Bytes - b.Bytes}
}

func (a wireSnapshot) add(b wireSnapshot) wireSnapshot {
	return wireSnapshot{a.Bursts + b.Bursts, a.Commands + b.Commands, a.Bytes + b.Bytes}
}

// conn wraps a connection so that w counts its traffic.
func (w *wire) conn(c net.Conn) net.Conn { return &countedConn{Conn: c, w: w} }

type countedConn struct {
	net.Conn
	w     *wire
	wrote atomic.Bool // written since the last read
	resp  respCounter // writes on one connection are not concurrent
}

func (c *countedConn) Write(p []byte) (int, error) {
	if !c.wrote.Swap(true) {
		c.w.bursts.Add(1)
	}
	c.w.bytes.Add(int64(len(p)))
	if n := c.resp.feed(p); n > 0 {
		c.w.commands.Add(n)
	}
	return c.Conn.Write(p)
}

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.wrote.Store(false)
	}
	return n, err
}

// respCounter counts the commands (RESP arrays of bulk strings) in a stream
// of writes, which may split them anywhere.
type respCounter struct {
	state int
	elems int // bulk strings left in the current command
	num   int // the length being read
	skip  int // bytes left in the current bulk string, its CRLF included
}

const (
	respCommand = iota // expecting '*'
	respArrayLen
	respBulk // expecting '$'
	respBulkLen
	respBody
)

func (r *respCounter) feed(p []byte) int64 {
	var n int64
	for i := 0; i < len(p); i++ {
		b := p[i]
		switch r.state {
		case respCommand:
			if b == '*' {
				r.num, r.state = 0, respArrayLen
			}
		case respArrayLen, respBulkLen:
			switch {
			case b >= '0' && b <= '9':
				r.num = r.num*10 + int(b-'0')
			case b == '\n' && r.state == respArrayLen:
				n++
				r.elems = r.num
				r.state = respBulk
				if r.elems == 0 {
					r.state = respCommand
				}
			case b == '\n':
				r.skip, r.state = r.num+2, respBody
			}
		case respBulk:
			if b == '$' {
				r.num, r.state = 0, respBulkLen
			}
		case respBody:
			k := min(r.skip, len(p)-i)
			r.skip -= k
			i += k - 1
			if r.skip == 0 {
				r.elems--
				r.state = respBulk
				if r.elems == 0 {
					r.state = respCommand
				}
			}
		}
	}
	return n
}

// goRedis returns a go-redis client with default options whose connections
// cfg.wire counts. On a slow server (callgrind) its timeouts are long; where
// the server dumps after every script call, cfg.scripts sees the scripts it
// sends.
func goRedis(cfg config) *redis.Client {
	var d net.Dialer
	opt := &redis.Options{
		Addr: cfg.addr,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return cfg.wire.conn(c), nil
		},
	}
	if cfg.slow {
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = slowTimeout, slowTimeout, slowTimeout
	}
	opt.ContextTimeoutEnabled = cfg.ctxTimeout
	rdb := redis.NewClient(opt)
	if cfg.scripts != nil {
		rdb.AddHook(cfg.scripts)
	}
	return rdb
}

// slowTimeout bounds a call to a server run by callgrind, 20 to 50 times
// slower than usual, and paused while it writes a dump.
const slowTimeout = time.Minute
