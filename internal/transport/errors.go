package transport

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// The transport's sentinels. The root package re-exports each under the
// same name (remutex.ErrClosed is ErrClosed), so errors.Is matches either,
// and documents them for users; their texts are the public ones.
var (
	// ErrClosed is returned for calls on a Client after Close.
	ErrClosed = errors.New("remutex: client closed")

	// ErrTooFewReplicas reports that fewer replicas than WithReplicaAck asks
	// for acknowledged a write in time.
	ErrTooFewReplicas = errors.New("remutex: too few replicas acknowledged")

	// ErrNoQuorum reports that a quorum could not reach a majority of its
	// servers for a call.
	ErrNoQuorum = errors.New("remutex: no majority of servers answered")

	// ErrEvictionPolicy reports a server whose maxmemory-policy may evict
	// lock keys.
	ErrEvictionPolicy = errors.New("remutex: maxmemory-policy may evict lock keys")

	// ErrDegraded matches a check's error when all it found leaves the
	// locks working, in a lesser way.
	ErrDegraded = errors.New("remutex: locks work, degraded")
)

// IsReply reports whether err is, or wraps, an error reply of the server
// (go-redis's parser errors included). Its target escapes, so callers on an
// uncontended path call it only once err is not nil.
func IsReply(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// IsProtocolError reports an error of go-redis's reply parser: the server
// answered with something that is not a Redis reply.
func IsProtocolError(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "redis: invalid reply") || strings.HasPrefix(msg, "redis: can't parse")
}

// Transient reports whether err is worth retrying: network failures,
// timeouts (a deadline that ended a call: callers look at their own
// context first), and the Redis replies above. Everything else (WRONGTYPE,
// NOPERM, OOM, script errors, a server that is not Redis, ErrClosed, a
// cancelled context) is permanent.
func Transient(err error) bool {
	var f final
	if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) || errors.As(err, &f) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if errors.Is(err, ErrTooFewReplicas) || errors.Is(err, ErrNoQuorum) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return wire.TransientReply(rerr.Error())
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

// final marks an error that would be transient as one not to retry the
// call for (see node.ackedCall); it reads as the error it wraps.
type final struct{ error }

func (f final) Unwrap() error { return f.error }

// jitter is a random duration in [0, d).
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// Backoff is capped exponential backoff with jitter: by default from 10ms
// to 1s, for transient errors.
type Backoff struct{ D, First, Limit time.Duration }

// Next is the wait before the next try.
func (b *Backoff) Next() time.Duration {
	if b.First == 0 {
		b.First, b.Limit = 10*time.Millisecond, time.Second
	}
	switch {
	case b.D == 0:
		b.D = b.First
	case b.D < b.Limit:
		b.D = min(2*b.D, b.Limit)
	}
	return b.D/2 + jitter(b.D/2)
}

// closedChan is a closed channel.
var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// IsClosed reports whether ch is closed.
func IsClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
