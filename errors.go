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

	// ErrAuthRequired reports that the Redis server refused a call because
	// the connection is not authenticated (NOAUTH, or the "unauthenticated"
	// protocol error with which Redis answers long commands before AUTH):
	// the redis client's options need a Password (and Username, with ACL
	// users). It is permanent: Lock and TryLock panic with it, the Context
	// forms return it. The server's own reply is wrapped with it.
	ErrAuthRequired = errors.New("remutex: Redis requires authentication (NOAUTH): set Password/Username in the redis client's options")

	// ErrUpgrade reports that a goroutine holding a DistRWMutex for reading
	// (and not for writing) asked for the write lock: it would wait for its
	// own read hold to end, forever. RUnlock first; Lock panics with it,
	// LockContext and TryLockContext return it at once, TryLock says false.
	ErrUpgrade = errors.New("remutex: read→write upgrade would deadlock: the goroutine holds the lock for reading (RUnlock first)")

	// ErrInvalidName matches the error for a lock name that NewMutex would
	// refuse (empty, longer than MaxNameLen bytes, or starting with '}'), as
	// CheckName, Inspect and ForceUnlock return it.
	ErrInvalidName = errors.New("remutex: invalid lock name")
)

// WrongTypeError reports that a key under a lock's name holds a value of
// another type, or that its fence counter holds a string that is not an
// integer. remutex made no write: the data is left as it was. It is a
// permanent error: Lock and TryLock panic with it, the Context forms return it.
type WrongTypeError struct {
	Key string // the Redis key
	// Type is the type the key holds, as TYPE reports it, or "non-integer"
	// for a fence counter (P{N}:fence) that holds a string that is not an
	// integer.
	Type string
}

func (e *WrongTypeError) Error() string {
	if e.Type == nonInteger {
		return fmt.Sprintf("remutex: key %q holds a non-integer string, not a remutex fence counter", e.Key)
	}
	return fmt.Sprintf("remutex: key %q holds a %s, not a remutex lock", e.Key, e.Type)
}

// nonInteger is the WrongTypeError.Type of a fence counter that holds a
// string that is not an integer.
const nonInteger = "non-integer"

// nameError is an invalid lock name: it matches ErrInvalidName.
type nameError struct{ reason error }

func (e *nameError) Error() string        { return "remutex: " + e.reason.Error() }
func (e *nameError) Is(target error) bool { return target == ErrInvalidName }

// authError is a refusal of an unauthenticated call: it matches
// ErrAuthRequired and wraps the server's reply.
type authError struct{ reply error }

func (e *authError) Error() string {
	return ErrAuthRequired.Error() + " (the server said: " + e.reply.Error() + ")"
}
func (e *authError) Is(target error) bool { return target == ErrAuthRequired }
func (e *authError) Unwrap() error        { return e.reply }

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
// typed WrongTypeError where a script refused a key, an error matching
// ErrAuthRequired where the server wants authentication, otherwise err
// itself.
func scriptError(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := err.Error()
		if rest, ok := strings.CutPrefix(msg, "WRONGTYPE remutex "); ok {
			typ, key, _ := strings.Cut(rest, " ")
			return &WrongTypeError{Key: key, Type: typ}
		}
		// Redis answers a command of more than a few arguments from an
		// unauthenticated connection with "Protocol error: unauthenticated
		// multibulk length" (and closes it), shorter ones with NOAUTH.
		if strings.HasPrefix(msg, "NOAUTH") || strings.Contains(msg, "unauthenticated") {
			return &authError{reply: err}
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

// Causes of a lost hold, wrapped in ErrLockLost.
var (
	errHoldGone = errors.New("the lock's key no longer holds this owner (expired, deleted or overwritten)")
	errExpired  = errors.New("no renewal succeeded before the lease's validity deadline")
	errDenied   = errors.New("renewal found the lock no longer held by this owner (its key expired, was deleted, or is held by another)")
	errLeaseEnd = errors.New("the fixed lease ran out (WithoutRenewal)")
)
