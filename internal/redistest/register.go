package redistest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// registerLua is a fenced register: a write has a begin and an end, and each
// is accepted only if the writer's fence is at least the highest fence seen.
// Every attempt is appended to a log as
// "<ok|stale> <fence> <writer> <start µs> <end µs>" in server time, so that
// overlapping writes and stale writers are visible afterwards.
// KEYS: highest fence, log, open writes. ARGV: begin|end, fence, writer.
const registerLua = `
local t = redis.call('time')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
local top = tonumber(redis.call('get', KEYS[1]) or '0')
local op, fence, writer = ARGV[1], ARGV[2], ARGV[3]
if op == 'begin' then
  if tonumber(fence) < top then
    redis.call('rpush', KEYS[2], 'stale ' .. fence .. ' ' .. writer .. ' ' .. now .. ' ' .. now)
    return 0
  end
  redis.call('set', KEYS[1], fence)
  redis.call('hset', KEYS[3], writer, fence .. ' ' .. now)
  return 1
end
local open = redis.call('hget', KEYS[3], writer)
redis.call('hdel', KEYS[3], writer)
local start = now
local ok = tonumber(fence) >= top
if open then
  local of, os = string.match(open, '^(%d+) (%d+)$')
  start = os
  if of ~= fence then ok = false end
else
  ok = false
end
local status = 'stale'
if ok then status = 'ok' end
redis.call('rpush', KEYS[2], status .. ' ' .. fence .. ' ' .. writer .. ' ' .. start .. ' ' .. now)
if ok then return 1 end
return 0
`

var registerScript = redis.NewScript(registerLua)

// MinSection is the shortest critical section Enter makes: long enough for
// an overlap to show in the register's log.
const MinSection = time.Millisecond

// Register stands for the resource a lock protects. Its holders, in this
// process or in children, write to it with their fence; it refuses a write
// whose fence is below the highest it has seen, and logs every attempt in
// the server's time, so that Check finds overlapping writers, fences that
// went back, and stale writers. It lives on a redis-server of its own
// (Shared), which outlives whatever faults a test does to the lock's
// servers.
type Register struct {
	rdb  *redis.Client
	addr string
	key  string

	seq  atomic.Int64 // numbers the writers of Enter
	mu   sync.Mutex
	errs []error // of Enter's calls
}

var registers atomic.Int64

// NewRegister returns an empty register on the shared server, closed at
// the end of the test.
func NewRegister(t testing.TB) *Register {
	t.Helper()
	key := "register:" + strconv.FormatInt(time.Now().UnixNano(), 36) + "." + strconv.FormatInt(registers.Add(1), 10)
	r := OpenRegister(Shared(t).Addr(), key)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// NewRegisterOn is NewRegister on the server srv: on its unix socket if it
// has one (StartUnix: a register that no network fault reaches, from any
// network namespace), else on its Addr.
func NewRegisterOn(t testing.TB, srv *Server) *Register {
	t.Helper()
	addr := srv.UnixSocket()
	if addr == "" {
		addr = srv.Addr()
	}
	key := "register:" + strconv.FormatInt(time.Now().UnixNano(), 36) + "." + strconv.FormatInt(registers.Add(1), 10)
	r := OpenRegister(addr, key)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// OpenRegister opens the register key on the server at addr (host:port, or
// the path of a unix socket, which starts with "/"): in a child, the one the
// test made (its Addr and Key). Close it after use.
func OpenRegister(addr, key string) *Register {
	o := &redis.Options{Addr: addr}
	if strings.HasPrefix(addr, "/") {
		o.Network = "unix"
	}
	return &Register{rdb: redis.NewClient(o), addr: addr, key: key}
}

// Addr returns the address of the register's server.
func (r *Register) Addr() string { return r.addr }

// Key returns the register's name on its server.
func (r *Register) Key() string { return r.key }

// Close closes the register's connections.
func (r *Register) Close() error { return r.rdb.Close() }

func (r *Register) call(ctx context.Context, op string, fence int64, writer string) (bool, error) {
	keys := []string{r.key + ":top", r.key + ":log", r.key + ":open"}
	n, err := registerScript.Run(ctx, r.rdb, keys, op, fence, writer).Int64()
	return n == 1, err
}

// Begin starts a write of writer, one hold; it is accepted if fence is not
// below the highest seen.
func (r *Register) Begin(ctx context.Context, fence int64, writer string) (bool, error) {
	return r.call(ctx, "begin", fence, writer)
}

// End completes the write writer began; it is accepted if the begin was and
// fence is still not below the highest seen.
func (r *Register) End(ctx context.Context, fence int64, writer string) (bool, error) {
	return r.call(ctx, "end", fence, writer)
}

// Write is Begin and End at once.
func (r *Register) Write(ctx context.Context, fence int64, writer string) (bool, error) {
	ok, err := r.Begin(ctx, fence, writer)
	if err != nil || !ok {
		return ok, err
	}
	return r.End(ctx, fence, writer)
}

// Enter begins the critical section of one hold of who with fence, and
// returns the function that ends it, at least MinSection later. Each call
// is a writer of its own (who#n): two sections with one fence are two
// holds sharing it. Errors are reported by CheckSections.
func (r *Register) Enter(who string, fence int64) (exit func()) {
	writer := strings.ReplaceAll(who, " ", "_") + "#" + strconv.FormatInt(r.seq.Add(1), 10)
	ctx := context.Background()
	if _, err := r.Begin(ctx, fence, writer); err != nil {
		r.fail(fmt.Errorf("%s: beginning a section: %w", who, err))
	}
	start := time.Now()
	return func() {
		time.Sleep(MinSection - time.Since(start))
		if _, err := r.End(ctx, fence, writer); err != nil {
			r.fail(fmt.Errorf("%s: ending a section: %w", who, err))
		}
	}
}

// EnterErrors returns the errors of Enter's calls so far.
func (r *Register) EnterErrors() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

func (r *Register) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

// Write is one logged write attempt.
type Write struct {
	OK         bool
	Fence      int64
	Writer     string
	Start, End int64 // server time, µs
}

func (w Write) String() string {
	s := "stale"
	if w.OK {
		s = "ok"
	}
	return fmt.Sprintf("%s fence=%d writer=%s [%d, %d]", s, w.Fence, w.Writer, w.Start, w.End)
}

// Log returns every write attempt in the order the register saw them.
func (r *Register) Log(t testing.TB) []Write {
	t.Helper()
	lines, err := r.rdb.LRange(context.Background(), r.key+":log", 0, -1).Result()
	if err != nil {
		t.Fatalf("reading the register: %v", err)
	}
	ws := make([]Write, 0, len(lines))
	for _, l := range lines {
		w, err := parseWrite(l)
		if err != nil {
			t.Fatalf("register entry %q: %v", l, err)
		}
		ws = append(ws, w)
	}
	return ws
}

func parseWrite(l string) (Write, error) {
	f := strings.Fields(l)
	if len(f) != 5 {
		return Write{}, errors.New("want 5 fields")
	}
	w := Write{OK: f[0] == "ok", Writer: f[2]}
	var e1, e2, e3 error
	w.Fence, e1 = strconv.ParseInt(f[1], 10, 64)
	w.Start, e2 = strconv.ParseInt(f[3], 10, 64)
	w.End, e3 = strconv.ParseInt(f[4], 10, 64)
	return w, errors.Join(e1, e2, e3)
}

// Anomaly is a pair of accepted writes that a lock with fencing should
// have kept apart, or a write the register refused.
type Anomaly struct {
	Kind AnomalyKind
	// B is the later write. For a refused write, A is the write with the
	// highest fence among those that began before it: the one whose fence
	// it fell below (zero if none did).
	A, B Write
}

// AnomalyKind says what is wrong.
type AnomalyKind string

const (
	Overlap     AnomalyKind = "overlapping writes"          // accepted writes of two holds overlap in time
	SharedFence AnomalyKind = "two holders share a fence"   // two holds got one token
	FenceBack   AnomalyKind = "fence went back"             // a later accepted write has a lower token
	Refused     AnomalyKind = "refused write (stale fence)" // its fence was below one seen before
)

func (a Anomaly) String() string {
	if a.Kind == Refused {
		return fmt.Sprintf("%s: %v, below %v", a.Kind, a.B, a.A)
	}
	return fmt.Sprintf("%s: %v and %v", a.Kind, a.A, a.B)
}

// Anomalies returns the accepted writes, in the order they began, and
// everything wrong with the log, without failing the test: for tests that
// record what a deployment does rather than assert that nothing happens.
func (r *Register) Anomalies(t testing.TB) (accepted []Write, found []Anomaly) {
	t.Helper()
	log := r.Log(t)
	sort.SliceStable(log, func(i, j int) bool { return log[i].Start < log[j].Start })
	var top Write // the highest fence among the writes that began so far
	for _, w := range log {
		if w.OK {
			accepted = append(accepted, w)
		} else if w.Fence < top.Fence {
			found = append(found, Anomaly{Kind: Refused, A: top, B: w})
		} else {
			found = append(found, Anomaly{Kind: Refused, B: w})
		}
		if w.Fence > top.Fence {
			top = w
		}
	}
	for i := 1; i < len(accepted); i++ {
		a, b := accepted[i-1], accepted[i]
		switch {
		case b.Fence < a.Fence:
			found = append(found, Anomaly{Kind: FenceBack, A: a, B: b})
		case b.Fence == a.Fence && b.Writer != a.Writer:
			found = append(found, Anomaly{Kind: SharedFence, A: a, B: b})
		case b.Writer != a.Writer && b.Start < a.End:
			found = append(found, Anomaly{Kind: Overlap, A: a, B: b})
		}
	}
	return accepted, found
}

// Check fails the test if accepted writes overlap in time, if their fences
// go back, or if two writers (holds) share a fence; it returns the accepted
// and the stale (refused) writes.
func (r *Register) Check(t testing.TB) (accepted, stale []Write) {
	t.Helper()
	accepted, found := r.Anomalies(t)
	for _, a := range found {
		if a.Kind == Refused {
			stale = append(stale, a.B)
			continue
		}
		t.Errorf("register: %v", a)
	}
	return accepted, stale
}

// CheckSections is Check for the sections of Enter: it also fails the test
// if any was refused or failed, if any lasted less than MinSection, or if
// fewer than want were accepted.
func (r *Register) CheckSections(t testing.TB, want int) {
	t.Helper()
	for _, err := range r.EnterErrors() {
		t.Error(err)
	}
	accepted, stale := r.Check(t)
	for _, w := range stale {
		t.Errorf("register: got a refused section %v (its fence was below one seen before), want none", w)
	}
	for _, w := range accepted {
		if d := time.Duration(w.End-w.Start) * time.Microsecond; d < MinSection {
			t.Errorf("register: section %v lasted %v: got less than %v, want at least", w, d, MinSection)
		}
	}
	if len(accepted) < want {
		t.Errorf("register: got %d critical sections, want %d", len(accepted), want)
	}
}

// Crowds returns the groups of more than limit accepted writes that were
// open at one instant (each group is the writes open when its last one
// began), for a resource that admits limit holders at once: a semaphore's
// holders write with fence 0, which the register never refuses, and
// Crowds counts them.
func Crowds(accepted []Write, limit int) [][]Write {
	sorted := append([]Write(nil), accepted...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	var found [][]Write
	var open []Write
	for _, w := range sorted {
		kept := open[:0]
		for _, o := range open {
			if o.End > w.Start {
				kept = append(kept, o)
			}
		}
		open = append(kept, w)
		if len(open) > limit {
			found = append(found, append([]Write(nil), open...))
		}
	}
	return found
}
