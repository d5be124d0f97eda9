package remutex

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/remutex/remutex/internal/wire"
)

// lockSpec is what the scripts need of one lock (a DistMutex, or one side
// of a DistRWMutex), boxed once: its kind, and what its name and options
// make of it.
type lockSpec struct {
	*kind
	name     string
	sc       *scriptSet    // the kind's scripts
	keys     []string      // hash, fence, queue (DistRWMutex: and readers)
	keyArgs  []interface{} // keys, boxed
	home     string        // the key its holds live in: what the Client's state and channel are named by
	channel  string        // where this Client hears of the lock: <home>:released:<client id>
	lease    time.Duration
	claim    time.Duration // lease of a queue grant until the watchdog extends it
	ttl      time.Duration // a waiter calls again every third of it (see maxQueueTTL)
	leaseArg interface{}
	keepArg  interface{}   // nested calls: the lease, or "0" (keep the TTL) WithoutRenewal
	minHold  time.Duration // WithMinHold
	renewArg interface{}   // the watchdog's lease argument (renew.lua)
	claimMs  string
	flag     string // the kind of its queue entries (see the scripts)
	fence    fenceMode
	size     interface{} // a DistSemaphore's size (its scripts' argument); nil for a lock
	// sized is set once a DistSemaphore's size was found to agree with
	// Redis's (see quick_sem.lua); nil for a lock.
	sized *atomic.Bool
	quick *quick // the uncontended cycle; nil for a DistRWMutex's write side
}

func (s *lockSpec) hash() string { return s.home }

// keyCounts are the boxed key counts of script calls, which is what
// ClusterClient looks at to route them.
var keyCounts = func() (a [maxBatch + 1]interface{}) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// newSpec computes the keys and boxed script arguments of a lock of kind k.
func (c *Client) newSpec(name string, cfg mutexConfig, k *kind) lockSpec {
	s := lockSpec{kind: k, name: name, sc: k.scripts, keys: k.keysOf(c.prefix, name), lease: cfg.lease, flag: k.flag}
	s.home = s.keys[k.home]
	s.quick = c.newQuick(k, s.keys)
	s.keyArgs = make([]interface{}, len(s.keys))
	for i, key := range s.keys {
		s.keyArgs[i] = key
	}
	s.channel = s.home + wire.ReleasedInfix + c.id
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
	s.claimMs = strconv.FormatInt(s.claim.Milliseconds(), 10)
	if cfg.fencing {
		s.fence = fenceOn
		s.flag = k.fencedFlag
	}
	return s
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
