package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// replicaEnv names the variable that makes the program a replica; it holds
// the replica's spec as JSON.
const replicaEnv = "LEADER_REPLICA"

// spec is what a replica is told by the parent: the same for all of them
// but the id, as the configuration of a deployment would be.
type spec struct {
	ID       int           `json:"id"`       // replica-<ID>, the value it campaigns with
	Election string        `json:"election"` // the election's name
	Register string        `json:"register"` // the fenced register: the last term written
	Writes   string        `json:"writes"`   // the register's log of writes
	Lease    time.Duration `json:"lease"`
	Every    time.Duration `json:"every"` // the job's period
}

// note is what a replica tells the parent, one JSON line on its stdout.
type note struct {
	At   int64  `json:"at"`   // when, in Unix nanoseconds (one host: one clock)
	Kind string `json:"kind"` // campaigns, leads, job, sees, stops
	PID  int    `json:"pid,omitempty"`
	Term int64  `json:"term,omitempty"`
	N    int    `json:"n,omitempty"` // job: the how-manyth run of the job in the term
	// Since (leads) is when the term began on the Redis server's clock,
	// in Unix milliseconds (Leader.Since); 0 if unknown.
	Since int64  `json:"since,omitempty"`
	OK    bool   `json:"ok,omitempty"`  // job: the register took the write
	Who   string `json:"who,omitempty"` // sees: the leader's value
	Why   string `json:"why,omitempty"` // stops: why the term ended
}

// registerScript is the fenced register the job writes to, as a leader
// writes to storage: KEYS = the last term written, the log of writes; ARGV
// = term, replica, run. It refuses a term lower than the last one (0) and
// takes any other (1); the log records both, with the server's time in
// Unix milliseconds, so that the parent can check that no term went back
// and that no leader wrote once a later term had begun.
var registerScript = redis.NewScript(`
local t = redis.call('TIME')
local ms = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
local entry = ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ms
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('RPUSH', KEYS[2], entry .. ' refused')
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], entry .. ' ok')
return 1
`)

// replicaMain is a replica process. It returns the exit status.
func replicaMain(js string) int {
	var s spec
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		fmt.Fprintln(os.Stderr, "leader replica:", err)
		return 2
	}
	// SIGTERM is how an orchestrator stops a replica; stdin closes if the
	// parent dies, so that no replica outlives it. (The goroutine that
	// waits for that ends with the process.)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if err := replica(ctx, s, os.Getenv("REDIS_ADDR"), &teller{w: os.Stdout}); err != nil {
		fmt.Fprintf(os.Stderr, "leader replica-%d: %v\n", s.ID, err)
		return 1
	}
	return 0
}

// replica campaigns with DistElection.Run until ctx ends, and while it
// leads runs the job every s.Every. It prints who leads when another does.
func replica(ctx context.Context, s spec, addr string, tell *teller) error {
	if addr == "" {
		return errors.New("REDIS_ADDR not set")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)
	defer locks.Close() // before rdb.Close: deferred calls run last in, first out
	e := locks.NewElection(s.Election, remutex.WithLease(s.Lease))
	self := fmt.Sprintf("replica-%d", s.ID)

	tell.say(note{Kind: "campaigns", PID: os.Getpid()})
	err := e.Run(ctx, self, func(tctx context.Context) error {
		// tctx ends when the term does: lost (before anyone else can
		// lead), or ctx ended, after which Run resigns.
		term, at := e.Term(), time.Now().UnixNano()
		var since int64
		if l, err := e.Leader(tctx); err == nil && l.Term == term {
			since = l.Since.UnixMilli()
		}
		tell.say(note{At: at, Kind: "leads", Term: term, Since: since})
		err := job(tctx, s, rdb, term, tell)
		why := "asked to stop: Run resigns the term"
		if cause := context.Cause(tctx); err != nil {
			why = err.Error()
		} else if errors.Is(cause, remutex.ErrLockLost) {
			why = "term lost: " + cause.Error()
		}
		tell.say(note{Kind: "stops", Term: term, Why: why})
		return err
	}, remutex.OnNewLeader(func(l remutex.Leader) {
		if l.Value != self {
			tell.say(note{Kind: "sees", Who: l.Value, Term: l.Term, PID: l.PID})
		}
	}))
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil // stopped: Run resigned
	}
	return err
}

// job runs the scheduled job every s.Every until ctx ends: a write to the
// register fenced by the term. A Redis error ends it, and with it Run; so
// does a write that the register refused: a later term wrote before it,
// and this leader, stale, steps down.
func job(ctx context.Context, s spec, rdb *redis.Client, term int64, tell *teller) error {
	t := time.NewTicker(s.Every)
	defer t.Stop()
	for n := 1; ; n++ {
		took, err := registerScript.Run(ctx, rdb, []string{s.Register, s.Writes}, term, s.ID, n).Bool()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("job: %w", err)
		}
		tell.say(note{Kind: "job", Term: term, N: n, OK: took})
		if !took {
			return fmt.Errorf("job: the register refused term %d: a later term wrote before it", term)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if ctx.Err() != nil {
				return nil // both were ready: the term ended first, or at once
			}
		}
	}
}

// teller writes notes, one JSON line each, from any goroutine.
type teller struct {
	mu sync.Mutex
	w  io.Writer
}

// say writes n, with the time now unless n.At is set.
func (t *teller) say(n note) {
	if n.At == 0 {
		n.At = time.Now().UnixNano()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	_ = json.NewEncoder(t.w).Encode(n)
}
