package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/remutex/remutex/internal/wire"
)

// Inspection and forced release, the server side: inspect.lua's reply read
// into records, and the holds it found released through their own kinds'
// scripts. The root makes the public LockInfo of the records.

// AdminKind is one kind of lock as Inspect and ForceUnlock see it. Another
// kind of lock is one more entry in AdminKinds (and, for a structure
// inspect.lua does not read yet, one more letter there and in readRole).
type AdminKind struct {
	Name  string                             // LockInfo.Kind
	Keys  func(prefix, name string) []string // its keys, in the order of Roles
	Roles string                             // what inspect.lua reads at each key
}

// AdminKinds are the kinds of lock, in the order Inspect reports them.
var AdminKinds = [...]AdminKind{
	{Name: "mutex", Keys: wire.LockKeys, Roles: "hfq"},
	{Name: "rwmutex", Keys: wire.RWKeys, Roles: "hfqr"},
	{Name: "semaphore", Keys: wire.SemKeys, Roles: "pfqs"},
	// A DistOnce's lock (its runner and waiters; its records are read by
	// Client.InspectOnce).
	{Name: "once", Keys: wire.OnceLockKeys, Roles: "hfq"},
	// A DistElection's lock (its leader and candidates; its record is read
	// by DistElection.Leader).
	{Name: "election", Keys: wire.ElectLockKeys, Roles: "hfq"},
}

// adminRoles is inspect.lua's ARGV[1]: the roles of every kind's keys.
var adminRoles = func() interface{} {
	var b strings.Builder
	for _, k := range AdminKinds {
		b.WriteString(k.Roles)
	}
	return b.String()
}()

// AdminTarget is every kind of lock called name: what Inspect reads and
// ForceUnlock releases.
type AdminTarget struct {
	Name    string
	Keys    [len(AdminKinds)][]string // each kind's keys; Keys[0][0] is P{name}
	keyArgs []interface{}             // all of them, boxed, for one call of inspect.lua
	// spec is the lock whose release script ends a hold (a read hold if
	// read) of a lock of kind (an index in AdminKinds) whose size is size
	// (a semaphore's; 0 for the others).
	spec func(kind int, size int64, read bool) *Spec
}

// NewAdminTarget returns the locks called name under prefix; spec gives
// the lock whose release script ends a hold (a read hold if read) of kind
// (an index in AdminKinds) whose size is size (a semaphore's, else 0).
func NewAdminTarget(prefix, name string, spec func(kind int, size int64, read bool) *Spec) *AdminTarget {
	t := &AdminTarget{Name: name, spec: spec}
	for i, k := range AdminKinds {
		t.Keys[i] = k.Keys(prefix, name)
		for _, key := range t.Keys[i] {
			t.keyArgs = append(t.keyArgs, key)
		}
	}
	return t
}

// homes are the keys of kind i whose channels (<key>:released:<client id>)
// its waiters' Clients listen on: those its holds live in.
func (t *AdminTarget) homes(i int) []string {
	var homes []string
	for j, role := range AdminKinds[i].Roles {
		if role == 'h' || role == 'r' || role == 'p' {
			homes = append(homes, t.Keys[i][j])
		}
	}
	return homes
}

// Inspect runs inspect.lua (and with subscribers counts the Clients that
// listen on the locks' channels): one record per kind of lock.
func (n *node) Inspect(ctx context.Context, t *AdminTarget, subscribers bool) ([]LockRecord, error) {
	v, err := n.evalOn(ctx, t.keyArgs, inspectScript, adminRoles)
	if err != nil {
		return nil, err
	}
	recs, err := parseInspect(t, v)
	if err != nil || !subscribers {
		return recs, err
	}
	return recs, n.subscribers(ctx, t, recs)
}

// LockRecord is what inspect.lua read of one kind of lock under a name, as
// Redis keeps it: Inspect makes a LockInfo of it (lockInfo), ForceUnlock
// releases its holds.
type LockRecord struct {
	Holds       []HoldRecord // sorted by owner token, a write hold before a read hold (sortHolds)
	Fence, Size int64
	Queue       []string // the queue's entries, as stored
	Subscribers int      // Clients listening on its channels (see subscribers)
}

// HoldRecord is one hold as inspect.lua read it.
type HoldRecord struct {
	Field string // the hash field or member: the owner token, KeptPrefix before a kept hold's
	Count int    // the hold count; a semaphore holder's permits
	Read  bool   // a read hold of a DistRWMutex
	TTLMs int64  // its remaining lease in ms; negative without expiry
}

// Owner is the owner token of the hold.
func (h *HoldRecord) Owner() string { return strings.TrimPrefix(h.Field, KeptPrefix) }

// parseInspect decodes the reply of inspect.lua: one LockRecord per kind of
// lock, in the order of AdminKinds.
func parseInspect(t *AdminTarget, v interface{}) ([]LockRecord, error) {
	a, ok := v.([]interface{})
	if !ok || len(a) != len(t.keyArgs) {
		return nil, fmt.Errorf("remutex: unexpected inspect reply %v", v)
	}
	recs := make([]LockRecord, len(AdminKinds))
	for i, k := range AdminKinds {
		rec := LockRecord{Holds: []HoldRecord{}, Queue: []string{}}
		for j := range k.Roles {
			readRole(&rec, k.Roles[j], a[j])
		}
		a = a[len(k.Roles):]
		sortHolds(rec.Holds)
		recs[i] = rec
	}
	return recs, nil
}

// readRole adds to rec what inspect.lua read at one key of role r (see
// there).
func readRole(rec *LockRecord, r byte, v interface{}) {
	switch r {
	case 'h':
		hp, _ := v.([]interface{})
		if len(hp) != 2 {
			return
		}
		fields, _ := hp[0].([]interface{})
		pttl, _ := hp[1].(int64)
		for i := 0; i+1 < len(fields); i += 2 {
			count, _ := strconv.Atoi(fmt.Sprint(fields[i+1]))
			rec.Holds = append(rec.Holds, HoldRecord{Field: fmt.Sprint(fields[i]), Count: count, TTLMs: pttl})
		}
	case 'r':
		readers, _ := v.([]interface{})
		for i := 0; i+1 < len(readers); i += 2 {
			ms, _ := readers[i+1].(int64)
			rec.Holds = append(rec.Holds, HoldRecord{Field: fmt.Sprint(readers[i]), Count: 1, Read: true, TTLMs: ms})
		}
	case 'p':
		holders, _ := v.([]interface{})
		for i := 0; i+2 < len(holders); i += 3 {
			permits, _ := holders[i+1].(int64)
			ms, _ := holders[i+2].(int64)
			rec.Holds = append(rec.Holds, HoldRecord{Field: fmt.Sprint(holders[i]), Count: int(permits), TTLMs: ms})
		}
	case 'f':
		if f := fmt.Sprint(v); f != "" {
			rec.Fence, _ = strconv.ParseInt(f, 10, 64)
		}
	case 's':
		if f := fmt.Sprint(v); f != "" {
			rec.Size, _ = strconv.ParseInt(f, 10, 64)
		}
	case 'q':
		queue, _ := v.([]interface{})
		for _, e := range queue {
			rec.Queue = append(rec.Queue, fmt.Sprint(e))
		}
	}
}

// sortHolds orders holds by owner token, a write hold before a read hold
// of the same owner: the order of LockInfo.Holders, and of ForceUnlock's
// releases.
func sortHolds(holds []HoldRecord) {
	slices.SortFunc(holds, func(x, y HoldRecord) int {
		if c := strings.Compare(x.Owner(), y.Owner()); c != 0 {
			return c
		}
		if x.Read == y.Read {
			return 0
		}
		if x.Read {
			return 1
		}
		return -1
	})
}

// KeptPrefix begins the field that keeps a released lock taken for the
// rest of its minimum hold (WithMinHold; see release.lua).
const KeptPrefix = "kept:"

// ForceUnlock releases each hold that inspect finds, of every kind of lock
// (only those of owners, if any are given), with the release script of its
// kind and side, as its own final unlock would (a semaphore's: a release of
// all its permits).
func (n *node) ForceUnlock(ctx context.Context, t *AdminTarget, owners []string) (bool, error) {
	recs, err := n.Inspect(ctx, t, false)
	if err != nil {
		return false, err
	}
	released := false
	for kind, rec := range recs {
		for _, h := range rec.Holds {
			if len(owners) > 0 && !slices.Contains(owners, h.Owner()) {
				continue
			}
			res, err := n.Release(ctx, t.spec(kind, rec.Size, h.Read), h.Field, 0, "0")
			if err != nil {
				return released, err
			}
			released = released || res != wire.NotHeld
		}
	}
	return released, nil
}

// errQuorumAdmin is Inspect and ForceUnlock on a quorum: each server has
// its own view of a lock, which no single LockInfo describes.
var errQuorumAdmin = fmt.Errorf("remutex: %w on a quorum Client (NewQuorumClient): use a NewClient per server", errors.ErrUnsupported)

func (q *quorum) Inspect(context.Context, *AdminTarget, bool) ([]LockRecord, error) {
	return nil, errQuorumAdmin
}

func (q *quorum) ForceUnlock(context.Context, *AdminTarget, []string) (bool, error) {
	return false, errQuorumAdmin
}
