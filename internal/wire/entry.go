package wire

import (
	"strconv"
	"strings"
)

// Entry is a waiter's entry in a lock's queue (see queue.lua and sem.lua):
//
//	<claim ms>:<flag>:<wait id>-<at>.<arrival ms>:<owner>
//
// and a semaphore's waiter adds its request after the arrival
// (<wait id>-<at>.<arrival ms>.<permits>). The scripts read the claim lease,
// the flag and the permits; the rest is the waiter's, returned to it in the
// messages of its grants.
type Entry struct {
	ClaimMs string // the claim lease a grant of the entry carries, in ms
	Flag    string // the kind of the entry's lock and whether it is fenced
	Wait    uint64 // the wait id: one per wait of its Client
	// At is the send time of the call that wrote the entry, in ms since its
	// Client's epoch on the monotonic clock, rounded down: every call that
	// finds the entry queued writes its own, so a grant of the entry, which
	// names it as it stood, tells its waiter a time before the grant was
	// made, from which the grant's claim lease counts.
	At      int64
	Arrival int64 // unix ms, on the waiter's clock: for Client.Inspect
	// Permits is a semaphore's request, written only WithPermits.
	Permits     int
	WithPermits bool
	Owner       string // the acquisition's owner token
}

// String is the entry as the scripts keep it.
func (e Entry) String() string {
	s := e.ClaimMs + ":" + e.Flag + ":" + strconv.FormatUint(e.Wait, 10) + "-" + strconv.FormatInt(e.At, 10) + "." + strconv.FormatInt(e.Arrival, 10)
	if e.WithPermits {
		s += "." + strconv.Itoa(e.Permits)
	}
	return s + ":" + e.Owner
}

// WaitKey names a wait of owner with wait id wait: what the entries of one
// wait have in common, whatever send time they carry.
func WaitKey(wait uint64, owner string) string {
	return strconv.FormatUint(wait, 10) + ":" + owner
}

// ParseEntry returns the wait key (see WaitKey) of a queue entry named by a
// message, and the send time it carries; ok false if it is not an entry.
func ParseEntry(e string) (key string, at int64, ok bool) {
	// (Cut by cut, not split: a grant's message is read on the way to its
	// waiter, and the key is all it allocates.)
	_, rest, ok1 := strings.Cut(e, ":")    // the claim
	_, rest, ok2 := strings.Cut(rest, ":") // the flag
	mid, owner, ok3 := strings.Cut(rest, ":")
	if !ok1 || !ok2 || !ok3 {
		return "", 0, false
	}
	wait, rest, ok := strings.Cut(mid, "-")
	if !ok {
		return "", 0, false
	}
	ms, _, _ := strings.Cut(rest, ".")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return "", 0, false
	}
	return wait + ":" + owner, at, true
}

// ParseQueued decodes a queue entry as Client.Inspect reads it, leniently (a
// number that does not parse is left 0): ok false only if it is not an
// entry at all.
func ParseQueued(e string) (q Entry, ok bool) {
	parts := strings.SplitN(e, ":", 4)
	if len(parts) != 4 {
		return Entry{}, false
	}
	q.ClaimMs, q.Flag, q.Owner = parts[0], parts[1], parts[3]
	wait := strings.SplitN(parts[2], ".", 3)
	id, at, _ := strings.Cut(wait[0], "-")
	q.Wait, _ = strconv.ParseUint(id, 10, 64)
	q.At, _ = strconv.ParseInt(at, 10, 64)
	if len(wait) > 1 {
		q.Arrival, _ = strconv.ParseInt(wait[1], 10, 64)
	}
	if len(wait) > 2 {
		q.Permits, _ = strconv.Atoi(wait[2])
		q.WithPermits = true
	}
	return q, true
}
