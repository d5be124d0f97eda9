package remutex

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// ErrNotHeld is returned by UnlockContext when the calling goroutine (for a
	// NonReentrant mutex: the mutex) holds nothing.
	ErrNotHeld = errors.New("remutex: lock not held")

	// ErrLockLost reports that a hold ended before it was unlocked: its lease
	// expired, its key was deleted or overwritten, Redis lost it, or the Client
	// was closed. Whatever the hold protected may have been entered by another
	// holder since.
	ErrLockLost = errors.New("remutex: lock lost")

	// ErrClosed is returned for calls on a Client after Close.
	ErrClosed = errors.New("remutex: client closed")

	// ErrTooFewReplicas reports that fewer replicas than WithReplicaAck asks
	// for acknowledged an acquisition in time; it was rolled back. It is
	// transient: Lock retries it.
	ErrTooFewReplicas = errors.New("remutex: too few replicas acknowledged")

	// ErrNoQuorum reports that a quorum Client could not reach a majority of
	// its servers for a call (they failed, not that the lock was busy). It is
	// transient: Lock retries it.
	ErrNoQuorum = errors.New("remutex: no majority of servers answered")
)

// WrongTypeError reports that a key under a lock's name holds a value of
// another type. remutex made no write: the data is left as it was. It is a
// permanent error: Lock and TryLock panic with it, the Context forms return it.
type WrongTypeError struct {
	Key  string // the Redis key
	Type string // the type it holds, as TYPE reports it
}

func (e *WrongTypeError) Error() string {
	return fmt.Sprintf("remutex: key %q holds a %s, not a remutex lock", e.Key, e.Type)
}

// lockError wraps err with the name of the lock it concerns, keeping it
// matchable with errors.Is and errors.As.
func lockError(name string, err error) error {
	return &namedError{name: name, err: err}
}

type namedError struct {
	name string
	err  error
}

func (e *namedError) Error() string {
	return fmt.Sprintf("remutex: lock %q: %s", e.name, strings.TrimPrefix(e.err.Error(), "remutex: "))
}

func (e *namedError) Unwrap() error { return e.err }

// scriptError turns the error reply of a script call into a Go error: the
// typed WrongTypeError where a script refused a key, otherwise err itself.
func scriptError(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if rest, ok := strings.CutPrefix(err.Error(), "WRONGTYPE remutex "); ok {
			typ, key, _ := strings.Cut(rest, " ")
			return &WrongTypeError{Key: key, Type: typ}
		}
	}
	return err
}

// transientPrefixes are the Redis error replies that pass on their own:
// a server still loading, a failover in progress, a cluster reconfiguring.
var transientPrefixes = []string{
	"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
	"MOVED", "ASK", "BUSY ", "NOREPLICAS",
}

// transient reports whether err is worth retrying: network failures,
// timeouts, and the Redis replies above. Everything else (WRONGTYPE, NOPERM,
// OOM, script errors, ErrClosed, a context's end) is permanent.
func transient(err error) bool {
	if err == nil || errors.Is(err, ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrTooFewReplicas) || errors.Is(err, ErrNoQuorum) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range transientPrefixes {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) {
		return true
	}
	// go-redis reports some dial and pool problems as plain errors.
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "broken pipe") || strings.Contains(msg, "i/o timeout")
}
