package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// The commands read and free locks through the remutex package
// (Client.Inspect and Client.ForceUnlock): they know nothing of its keys,
// channels or scripts.

// lockClient returns a remutex Client on rdb with the locks' key prefix,
// logging its warnings to stderr, and opts. The caller closes it before rdb.
func (c *cli) lockClient(rdb redis.UniversalClient, opts ...remutex.Option) *remutex.Client {
	return remutex.NewClient(rdb, append([]remutex.Option{
		remutex.WithKeyPrefix(c.conn.keyPrefix()),
		remutex.WithLogger(slog.New(&lineHandler{w: c.stderr, mu: new(sync.Mutex)})),
	}, opts...)...)
}

// checkName says why name is not a lock name, without the "remutex: " the
// messages here carry already; nil for a valid name.
func checkName(name string) error {
	if err := remutex.CheckName(name); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "remutex: "))
	}
	return nil
}

// Kinds of lock, as remutex.LockInfo.Kind names them.
const (
	kindMutex     = "mutex"     // a DistMutex: run without --read, --write or --permits
	kindRWMutex   = "rwmutex"   // a DistRWMutex: run --read or --write
	kindSemaphore = "semaphore" // a DistSemaphore: run --permits
	kindOnce      = "once"      // a DistOnce's run: once
	kindElection  = "election"  // a DistElection's term: elect
)

// lockStatus is what status reports about one lock; it is also the JSON
// object of status --json.
type lockStatus struct {
	Name string `json:"name"`
	// Key is the key the lock's holds live in: remutex:{NAME} for a mutex,
	// remutex:{NAME}:rw for a read/write lock, remutex:{NAME}:sem for a
	// semaphore (the prefix is --prefix).
	Key string `json:"key"`
	// Kind is "mutex", "rwmutex" (a read/write lock), "semaphore", or ""
	// when nothing of any kind is under the name.
	Kind string `json:"kind"`
	Held bool   `json:"held"` // taken: some owner holds it (a semaphore: a permit), or it is kept (see holder.Kept)
	// Size is a semaphore's number of permits, 0 for the other kinds; the
	// permits held are the sum of its holders' counts.
	Size    int64    `json:"size"`
	Holders []holder `json:"holders"` // its holds; [] when free
	// TTLMillis is the remaining lease in milliseconds, the longest of the
	// holds': 0 when free, -1 if a key has no expiry (not something remutex
	// leaves).
	TTLMillis int64 `json:"ttl_ms"`
	// Fence is the last fencing token handed out, 0 if the lock was never
	// taken with fencing (a read/write lock: never for writing).
	Fence int64 `json:"fence"`
	// Readers is the number of read holds of a read/write lock.
	Readers int64 `json:"readers"`
	// Queued is the number of live waiters in the lock's queue in Redis.
	Queued int64 `json:"queued"`
	// Waiters are those waiters, in arrival order (the order in which they
	// get the lock); [] when none.
	Waiters []waiter `json:"waiters"`
	// WritersWaiting is the number of those that wait to write a read/write
	// lock (readers that come while one waits queue behind it).
	WritersWaiting int64 `json:"writers_waiting"`
	// Subscribers is the number of Clients listening for the lock's
	// messages: those waiting for it, and for a fraction of a second those
	// that waited last.
	Subscribers int64 `json:"subscribers"`
	// Others are the locks of other kinds under the same name (a mutex and
	// a read/write lock of one name are independent locks), when more than
	// one kind has state there.
	Others []lockStatus `json:"others,omitempty"`
	Error  string       `json:"error,omitempty"` // why the lock could not be read
	// Once is a once's record (kind "once" only): done or not, the run that
	// made it done, the latest failed run.
	Once *onceStatus `json:"once,omitempty"`
}

// onceStatus is what a once's records say (remutex.DistOnce.Inspect).
type onceStatus struct {
	Done   bool     `json:"done"`
	Run    *onceRun `json:"run,omitempty"`    // the successful run; nil if not done
	Failed *onceRun `json:"failed,omitempty"` // the latest failed run, while it is kept (a minute)
}

// onceRun is one run of a once.
type onceRun struct {
	Owner      string    `json:"owner"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Started    time.Time `json:"started"` // by the runner's clock
	DurationMs int64     `json:"duration_ms"`
	Error      string    `json:"error,omitempty"` // a failed run's
}

func onceRunOf(e *remutex.OnceError) *onceRun {
	if e == nil {
		return nil
	}
	return &onceRun{Owner: e.Owner, Host: e.Host, PID: e.PID, Started: e.Started, DurationMs: e.Duration.Milliseconds(), Error: e.Message}
}

// readOnce adds to st what the records of the once called st.Name say, if
// there is one: a once's lock status with Once set, among st's kinds.
func readOnce(ctx context.Context, locks *remutex.Client, st *lockStatus) error {
	info, err := locks.NewOnce(st.Name).Inspect(ctx)
	var wt *remutex.WrongTypeError
	if errors.As(err, &wt) {
		st.Others = append(st.Others, lockStatus{Name: st.Name, Key: info.Lock.Key, Kind: kindOnce, Holders: []holder{}, Waiters: []waiter{},
			Error: strings.TrimPrefix(wt.Error(), "remutex: ")})
		return nil
	}
	if err != nil {
		return err
	}
	if !info.Done && info.Failed == nil && len(info.Lock.Holders) == 0 && len(info.Lock.Waiters) == 0 {
		return nil
	}
	rec := &onceStatus{Done: info.Done, Run: onceRunOf(info.Run), Failed: onceRunOf(info.Failed)}
	switch {
	case st.Kind == kindOnce:
		st.Once = rec
		return nil
	case st.Kind == "":
		*st = statusOf(info.Lock)
		st.Kind, st.Once = kindOnce, rec
		return nil
	}
	for i := range st.Others {
		if st.Others[i].Kind == kindOnce {
			st.Others[i].Once = rec
			return nil
		}
	}
	o := statusOf(info.Lock)
	o.Kind, o.Once = kindOnce, rec
	st.Others = append(st.Others, o)
	return nil
}

// holder is one hold of a lock. A kept hold is a mutex's hold that its
// holder released while its minimum hold (run --min-hold) had time left:
// nobody holds the lock, but it stays taken for TTLMillis more.
type holder struct {
	Owner     string `json:"owner"`  // <client id>:<goroutine id>.<n>
	Count     int64  `json:"count"`  // its hold count (1 for a read hold, 0 for a kept one); a semaphore's holder: its permits
	Read      bool   `json:"read"`   // a read hold of a read/write lock
	Kept      bool   `json:"kept"`   // kept taken by its minimum hold after its release
	TTLMillis int64  `json:"ttl_ms"` // its remaining lease (kept: minimum hold); -1: no expiry
	Host      string `json:"host"`   // host of the holder's process
	PID       int    `json:"pid"`    // its process id
}

// waiter is one waiter in a lock's queue in Redis.
type waiter struct {
	Owner   string    `json:"owner"`   // the owner token it is to hold the lock under
	Read    bool      `json:"read"`    // it waits to read a read/write lock (false: to write it, or another kind)
	Permits int64     `json:"permits"` // the permits it asks for, of a semaphore; 0 for the other kinds
	Host    string    `json:"host"`    // host of the waiting process
	PID     int       `json:"pid"`     // its process id
	Since   time.Time `json:"since"`   // when it began to wait, by its own process's clock
}

// wants says what w waits for, in a lock of kind: "lock" (a mutex), "read"
// or "write" (a read/write lock), "N permits" (a semaphore).
func (w waiter) wants(kind string) string {
	switch {
	case kind == kindSemaphore:
		return plural(w.Permits, "permit")
	case kind == kindElection:
		return "term" // a candidate
	case kind != kindRWMutex:
		return "lock"
	case w.Read:
		return "read"
	}
	return "write"
}

// readStatus reads the state of lock name, of every kind. A key of another
// type under the name is reported in Error, not as err; err is a failed
// Redis call.
func readStatus(ctx context.Context, locks *remutex.Client, name string) (lockStatus, error) {
	info, err := locks.Inspect(ctx, name)
	var wt *remutex.WrongTypeError
	if errors.As(err, &wt) {
		return lockStatus{Name: name, Key: info.Key, Holders: []holder{}, Waiters: []waiter{},
			Error: strings.TrimPrefix(wt.Error(), "remutex: ")}, nil
	}
	if err != nil {
		return lockStatus{}, err
	}
	st := statusOf(info)
	for _, o := range info.Others {
		st.Others = append(st.Others, statusOf(o))
	}
	return st, readOnce(ctx, locks, &st)
}

// statusOf is the status of one kind of lock as Inspect read it.
func statusOf(info remutex.LockInfo) lockStatus {
	st := lockStatus{
		Name:           info.Name,
		Key:            info.Key,
		Kind:           info.Kind,
		Held:           len(info.Holders) > 0,
		Size:           info.Size,
		Holders:        make([]holder, len(info.Holders)),
		TTLMillis:      millis(info.TTL),
		Fence:          info.Fence,
		Readers:        int64(info.Readers),
		Queued:         int64(len(info.Waiters)),
		Waiters:        make([]waiter, len(info.Waiters)),
		WritersWaiting: int64(info.WritersWaiting),
		Subscribers:    int64(info.Subscribers),
	}
	for i, h := range info.Holders {
		st.Holders[i] = holder{Owner: h.Owner, Count: int64(h.Count), Read: h.Read, Kept: h.Kept, TTLMillis: millis(h.TTL), Host: h.Host, PID: h.PID}
	}
	for i, w := range info.Waiters {
		st.Waiters[i] = waiter{Owner: w.Owner, Read: w.Read, Permits: int64(w.Permits), Host: w.Host, PID: w.PID, Since: w.Since}
	}
	return st
}

// millis is a remaining lease in milliseconds: -1 for none (no expiry).
func millis(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}

// kinds returns st and the locks of other kinds under its name.
func (st lockStatus) kinds() []lockStatus {
	return append([]lockStatus{st}, st.Others...)
}

// ofKind returns the status of the lock of kind under st's name: st itself
// or one of its Others; a free one if there is none.
func (st lockStatus) ofKind(kind string) lockStatus {
	for _, k := range st.kinds() {
		if k.Kind == kind {
			return k
		}
	}
	return lockStatus{Name: st.Name, Kind: kind, Holders: []holder{}, Waiters: []waiter{}}
}

// stateKept is the state of a mutex that nobody holds but that its minimum
// hold keeps taken (run --min-hold).
const stateKept = "kept"

// state says in a word whether the lock is held and how: "free", "held" (a
// mutex), "kept" (a mutex held by nobody, kept taken by its minimum hold),
// "write" (a read/write lock held for writing, "write, read ×N" while its
// writer also holds a read hold), "read ×N" (N readers), "held H/S" and
// "free 0/S" (a semaphore of S permits, H of them held).
func (st lockStatus) state() string {
	writers := int64(len(st.Holders)) - st.Readers
	switch {
	case st.Error != "":
		return "not a lock"
	case st.Kind == kindOnce && st.Held:
		return "running"
	case st.Kind == kindOnce && st.Once != nil && st.Once.Done:
		return "done"
	case st.Kind == kindOnce && st.Once != nil && st.Once.Failed != nil:
		return "failed"
	case st.Kind == kindOnce:
		return "not done"
	case st.Kind == kindSemaphore && !st.Held:
		return fmt.Sprintf("free 0/%d", st.Size)
	case st.Kind == kindSemaphore:
		return fmt.Sprintf("held %d/%d", st.permitsHeld(), st.Size)
	case !st.Held:
		return "free"
	case st.Kind != kindRWMutex && st.kept():
		return stateKept
	case st.Kind != kindRWMutex:
		return "held"
	case writers > 0 && st.Readers > 0:
		return fmt.Sprintf("write, read ×%d", st.Readers)
	case writers > 0:
		return "write"
	}
	return fmt.Sprintf("read ×%d", st.Readers)
}

// kept reports whether st's holds are all kept by a minimum hold: nobody
// holds the lock, but it is taken.
func (st lockStatus) kept() bool {
	for _, h := range st.Holders {
		if !h.Kept {
			return false
		}
	}
	return len(st.Holders) > 0
}

// describe says who a holder is, for people.
func (h holder) describe() string {
	if h.Host == "" {
		return h.Owner
	}
	return fmt.Sprintf("%s (pid %d on %s)", h.Owner, h.PID, h.Host)
}

// describeHold says, for people, what a hold of a lock of kind is, who
// holds it, and how much of its lease is left.
func (h holder) describeHold(kind string) string {
	switch {
	case h.Kept:
		return fmt.Sprintf("kept taken by its minimum hold after a run by %s, with %s of it left", h.describe(), describeTTL(h.TTLMillis))
	case kind == kindSemaphore:
		return fmt.Sprintf("held by %s, %s, with %s of its lease left", h.describe(), plural(h.Count, "permit"), describeTTL(h.TTLMillis))
	case kind != kindRWMutex:
		return fmt.Sprintf("held by %s, hold count %d, with %s of its lease left", h.describe(), h.Count, describeTTL(h.TTLMillis))
	case h.Read:
		return fmt.Sprintf("held for reading by %s, with %s of its lease left", h.describe(), describeTTL(h.TTLMillis))
	}
	return fmt.Sprintf("held for writing by %s, hold count %d, with %s of its lease left", h.describe(), h.Count, describeTTL(h.TTLMillis))
}

// plural is n things: "1 permit", "2 permits".
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// describeTTL renders a remaining lease for people.
func describeTTL(ms int64) string {
	if ms < 0 {
		return "no expiry"
	}
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}
