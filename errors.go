package remutex

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
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
	ErrClosed = transport.ErrClosed

	// ErrTooFewReplicas reports that fewer replicas than WithReplicaAck asks
	// for acknowledged an acquisition in time; it was rolled back. It is
	// transient: Lock retries it.
	ErrTooFewReplicas = transport.ErrTooFewReplicas

	// ErrNoQuorum reports that a quorum Client could not reach a majority of
	// its servers for a call (they failed, not that the lock was busy). It is
	// transient: Lock retries it.
	ErrNoQuorum = transport.ErrNoQuorum

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
	// Type is the type the key holds, as TYPE reports it; "non-integer"
	// for a fence counter (P{N}:fence) or a semaphore's size (P{N}:sem:size)
	// that holds a string that is not an integer; "foreign-field" for a
	// semaphore's holders hash (P{N}:sem) with a field that is no holding;
	// "foreign-record" for a once's record (P{N}:once:done or :err), or an
	// election's (P{N}:elect:leader), that holds a string remutex did not
	// write.
	Type string
}

func (e *WrongTypeError) Error() string {
	switch e.Type {
	case nonInteger:
		what := "fence counter"
		if strings.HasSuffix(e.Key, ":sem:size") {
			what = "semaphore size"
		}
		return fmt.Sprintf("remutex: key %q holds a non-integer string, not a remutex %s", e.Key, what)
	case foreignField:
		return fmt.Sprintf("remutex: key %q holds a field that is not a remutex semaphore holding", e.Key)
	case foreignRecord:
		what := "once"
		if strings.HasSuffix(e.Key, ":elect:leader") {
			what = "election"
		}
		return fmt.Sprintf("remutex: key %q holds a string that is not a remutex %s record", e.Key, what)
	}
	return fmt.Sprintf("remutex: key %q holds a %s, not a remutex lock", e.Key, e.Type)
}

// nonInteger is the WrongTypeError.Type of a fence counter or semaphore
// size that holds a string that is not an integer; foreignField that of a
// semaphore's holders hash with a field that is no holding; foreignRecord
// that of a once's record (P{N}:once:done, P{N}:once:err) that holds a
// string that is not a record.
const (
	nonInteger    = "non-integer"
	foreignField  = "foreign-field"
	foreignRecord = "foreign-record"
)

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

// LockError is the error of an operation on one lock: DistMutex's and
// DistRWMutex's methods return their errors as a *LockError, and hand the
// errors they cannot return (to the error handler of WithErrorHandler) as
// one too, so that errors.As tells which lock and which operation. It wraps
// the cause: errors.Is(err, ErrLockLost) and the like see through it.
type LockError struct {
	Lock string // the lock's name
	// Op is the operation: "lock" (Lock, LockContext), "trylock" (TryLock,
	// TryLockContext) and "unlock" (Unlock, UnlockContext), prefixed with
	// "r" for the read side of a DistRWMutex ("rlock", "runlock", ...);
	// "hold" for a loss found while the lock was held (a renewal denied or
	// too late, a fixed lease that ran out, Close); "inspect" and
	// "forceunlock" for the Client's admin calls; "" where none applies.
	Op  string
	Err error // the cause
}

// Error reads "remutex: <op> <lock name, quoted>: <cause>", e.g.
// `remutex: unlock "stock:42": lock lost: ...` (with "lock" for an empty Op).
func (e *LockError) Error() string {
	op := e.Op
	if op == "" {
		op = "lock"
	}
	return fmt.Sprintf("remutex: %s %q: %s", op, e.Lock, strings.TrimPrefix(e.Err.Error(), "remutex: "))
}

func (e *LockError) Unwrap() error { return e.Err }

// lockError wraps err with the name of the lock it concerns, keeping it
// matchable with errors.Is and errors.As.
func lockError(name string, err error) error {
	return &LockError{Lock: name, Err: err}
}

// NoExpiryError reports that a lock's key holds a hold without an expiry:
// remutex never leaves one (every hold has a lease), so something else wrote
// it or removed its expiry, and the lock will not end by itself. Client.Inspect
// shows it; Client.ForceUnlock releases it. It is permanent: Lock and TryLock
// panic with it, the Context forms return it.
type NoExpiryError struct {
	Key   string // the Redis key
	Owner string // the owner token it holds, as the key names it
}

func (e *NoExpiryError) Error() string {
	return fmt.Sprintf("remutex: lock key %q is held by %q with no expiry (not a lease remutex set: release it with ForceUnlock, or find what wrote it)", e.Key, e.Owner)
}

// scriptError turns the error reply of a script call into a Go error: the
// typed WrongTypeError where a script refused a key, an error matching
// ErrAuthRequired where the server wants authentication, otherwise err
// itself.
func scriptError(err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := err.Error()
		if e, ok := wire.ParseScriptError(msg); e.Code != "" {
			switch {
			case !ok:
				return err // (one of the scripts' own that does not parse)
			case e.Code == "WRONGTYPE":
				return &WrongTypeError{Key: e.Key, Type: e.Type}
			case e.Code == "NOEXPIRY":
				return &NoExpiryError{Key: e.Key, Owner: e.Owner}
			}
			return &SizeError{Key: e.Key, Stored: e.Stored} // (Size: the semaphore fills it in)
		}
		if wire.AuthReply(msg) {
			return &authError{reply: err}
		}
		return err
	}
	if isProtocolError(err) {
		return fmt.Errorf("%w: the server does not speak the Redis protocol (is the address right?): %w", errNotRedis, err)
	}
	return err
}

// errNotRedis is the start of the error for a server that answered with
// something that is not a Redis reply (an HTTP server, say): permanent.
var errNotRedis = errors.New("remutex: not a Redis server")

// isReply, isProtocolError and transient are internal/transport's (see
// there): the engine retries what the transport would.
func isReply(err error) bool         { return transport.IsReply(err) }
func isProtocolError(err error) bool { return transport.IsProtocolError(err) }
func transient(err error) bool       { return transport.Transient(err) }

// Causes of a lost hold, wrapped in ErrLockLost.
var (
	errHoldGone = errors.New("the lock's key no longer holds this owner (expired, deleted or overwritten)")
	errExpired  = errors.New("no renewal succeeded before the lease's validity deadline")
	errDenied   = errors.New("renewal found the lock no longer held by this owner (its key expired, was deleted, or is held by another)")
	errLeaseEnd = errors.New("the fixed lease ran out (WithoutRenewal)")
)
