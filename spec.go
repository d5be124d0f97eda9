package remutex

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/remutex/remutex/internal/transport"
	"github.com/remutex/remutex/internal/wire"
)

// lockSpec is what the engine needs of one lock (a DistMutex, or one side
// of a DistRWMutex), boxed once: its kind, what the transport needs of it
// (transport.Spec: keys, scripts, boxed arguments, the quick cycle), and
// what its name and options make of it for the engine.
type lockSpec struct {
	*kind
	transport.Spec
	name     string
	channel  string        // where this Client hears of the lock: <home>:released:<client id>
	claim    time.Duration // lease of a queue grant until the watchdog extends it
	ttl      time.Duration // a waiter calls again every third of it (see maxQueueTTL)
	leaseArg interface{}
	keepArg  interface{}   // nested calls: the lease, or "0" (keep the TTL) WithoutRenewal
	minHold  time.Duration // WithMinHold
	renewArg interface{}   // the watchdog's lease argument (renew.lua)
	fence    fenceMode
}

// hash is the key its holds live in: what the Client's state and channel
// are named by.
func (s *lockSpec) hash() string { return s.Home }

// newSpec computes the keys and boxed script arguments of a lock of kind k.
func (c *Client) newSpec(name string, cfg mutexConfig, k *kind) lockSpec {
	keys := k.keysOf(c.prefix, name)
	s := lockSpec{kind: k, name: name, Spec: transport.Spec{Name: name, Scripts: k.scripts.set(), Keys: keys,
		Lease: cfg.lease, Flag: k.flag, Permits: k.permits, Records: k.records}}
	s.Home = keys[k.home]
	s.Quick = c.newQuick(k, keys)
	s.KeyArgs = make([]interface{}, len(keys))
	for i, key := range keys {
		s.KeyArgs[i] = key
	}
	s.channel = s.Home + wire.ReleasedInfix + c.id
	s.ttl = min(cfg.lease, maxQueueTTL)
	s.claim = s.ttl
	if cfg.noRenew {
		s.claim = cfg.lease // a fixed lease is granted whole
	}
	ms := strconv.FormatInt(cfg.lease.Milliseconds(), 10)
	s.leaseArg, s.keepArg, s.renewArg = ms, ms, k.renewTag+ms
	if cfg.noRenew {
		s.keepArg = "0"
	}
	s.minHold = cfg.minHold
	s.ClaimMs = strconv.FormatInt(s.claim.Milliseconds(), 10)
	if cfg.fencing {
		s.fence = fenceOn
		s.Flag = k.fencedFlag
	}
	return s
}

// newQuick returns the uncontended cycle of a lock of kind k on keys (see
// transport.NewQuick), or nil where there is none. Its contention is marked
// in one of c's 256 slots.
func (c *Client) newQuick(k *kind, keys []string) *transport.Quick {
	if k.quick == nil {
		return nil
	}
	hash := keys[0]
	// FNV-1a of the hash (both sides of a read/write lock share it), its top
	// byte the slot: its low byte depends on the low bits alone, and names
	// that differ in a suffix would share slots far more often than 1 in 256.
	h := uint32(2166136261)
	for i := 0; i < len(hash); i++ {
		h = (h ^ uint32(hash[i])) * 16777619
	}
	return transport.NewQuick(k.quick, keys, &c.contended[h>>24])
}

// configure checks what NewMutex or NewRWMutex (fn) was given, panicking
// with a message that says what is wrong.
func (c *Client) configure(fn, name string, opts []MutexOption) mutexConfig {
	if c == nil {
		panic("remutex: " + fn + " on a nil Client")
	}
	cfg := mutexConfig{lease: DefaultLease}
	for _, o := range opts {
		if o == nil {
			panic("remutex: " + fn + ": nil option")
		}
		o(&cfg)
	}
	if err := checkName(name); err != nil {
		panic("remutex: " + fn + ": " + err.Error())
	}
	if cfg.lease < MinLease || cfg.lease > MaxLease {
		panic(fmt.Sprintf("remutex: WithLease(%v): lease must be between %v and %v", cfg.lease, MinLease, MaxLease))
	}
	switch {
	case cfg.minHold == 0:
	case fn != "NewMutex":
		panic("remutex: " + fn + ": WithMinHold is an option of a DistMutex (NewMutex)")
	case cfg.minHold < MinLease || cfg.minHold > MaxLease:
		panic(fmt.Sprintf("remutex: WithMinHold(%v): must be between %v and %v", cfg.minHold, MinLease, MaxLease))
	case cfg.noRenew && cfg.minHold > cfg.lease:
		panic(fmt.Sprintf("remutex: WithMinHold(%v) exceeds the fixed lease (WithLease(%v), WithoutRenewal): the lock is held at most that long", cfg.minHold, cfg.lease))
	}
	return cfg
}

func (m *DistMutex) init(c *Client, name string, cfg mutexConfig, k *kind) {
	m.c = c
	m.spec = c.newSpec(name, cfg, k)
	m.renew = !cfg.noRenew
	m.reentrant = !cfg.nonReentrant
}

// checkName says what is wrong with a lock name, or nil.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty lock name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("lock name of %d bytes exceeds %d", len(name), MaxNameLen)
	case name[0] == '}':
		return fmt.Errorf("lock name %q starts with '}': its keys would not share a cluster slot", name)
	}
	return nil
}
