package remutex

import (
	"context"
	"slices"
	"sync/atomic"
	"time"
)

// quick is what a DistMutex, or a DistRWMutex's read side, sends for its
// uncontended cycle: quick_lock.lua and quick_unlock.lua (quick_rlock.lua
// and quick_runlock.lua), the free paths of the full scripts alone, on the
// keys they read, with the owner and the lease as their only arguments.
// Redis pays about as much per argument of a script call as per command the
// script runs: the cycle costs redis-server 65k instructions this way against
// 87k with the full scripts (callgrind; a SET NX PX and a Lua release of a
// string key cost 36k). Once a lock is seen contended (a busy reply, a waiter
// found at release, a hand-off), the full scripts are sent at once for
// contendedFor, so that a contended lock does not pay two calls where one
// does.
type quick struct {
	lock, unlock                     *luaScript
	lockKeys, fencedKeys, unlockKeys []interface{}
	until                            *atomic.Int64 // unix ns: contended until then (Client.contended)
}

// contendedFor is how long a lock seen contended is sent the full scripts.
const contendedFor = time.Second

// newQuick returns the uncontended cycle of a lock of the given kind and
// keys (see lockKeys, rwKeys), or nil where there is none.
func (c *Client) newQuick(kind lockKind, keys []string) *quick {
	hash, fence, queue := keys[0], keys[1], keys[2]
	h := uint32(2166136261) // FNV-1a of the hash: both sides of a read/write lock share it
	for i := 0; i < len(hash); i++ {
		h = (h ^ uint32(hash[i])) * 16777619
	}
	q := &quick{lock: quickLock, unlock: quickUnlock, lockKeys: []interface{}{hash, queue},
		unlockKeys: []interface{}{hash, queue}, until: &c.contended[h%uint32(len(c.contended))]}
	switch kind {
	case kindWrite:
		return nil
	case kindRead:
		readers := keys[4]
		q.lock, q.unlock = quickRLock, quickRUnlock
		q.lockKeys, q.unlockKeys = []interface{}{hash, queue, readers}, []interface{}{readers, queue}
	}
	q.fencedKeys = append(slices.Clip(q.lockKeys), fence)
	return q
}

// calm says whether the lock has not been seen contended lately.
func (q *quick) calm() bool { return q != nil && time.Now().UnixNano() >= q.until.Load() }

func (q *quick) contended() {
	if q != nil {
		q.until.Store(time.Now().Add(contendedFor).UnixNano())
	}
}

// quickLock runs the lock's quick_lock.lua or quick_rlock.lua: granted with
// the fence token (0 without fencing), or not (the lock is not free), the
// lock then marked contended.
func (n *node) quickLock(ctx context.Context, s *lockSpec, r acquireReq) (granted bool, fence int64, err error) {
	keys := s.quick.lockKeys
	if r.fence != fenceOff {
		keys = s.quick.fencedKeys
	}
	v, err := n.evalOn(ctx, keys, s.quick.lock, r.owner, r.lease)
	if err != nil {
		return false, 0, err
	}
	f, err := toInt64(v)
	switch {
	case err != nil:
		return false, 0, err
	case f < 0:
		s.quick.contended()
		return false, 0, nil
	}
	return true, f, nil
}
