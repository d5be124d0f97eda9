package transport

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// Counting the Clients that listen for a lock's messages, for Inspect's
// LockInfo.Subscribers.

// subscribers sets the subscribers of each kind of lock in recs: the
// Clients subscribed to the channels of the keys its holds live in
// (<key>:released:<client id>). One pattern, P{N}:*, finds those of every
// kind; channelKind tells them apart. On a Redis 7 cluster they are shard
// channels of the master serving the locks' slot; with classic pub/sub on a
// cluster a Client's connection may be on any node, so all are asked.
func (n *node) subscribers(ctx context.Context, t *AdminTarget, recs []LockRecord) error {
	base := t.Keys[0][0]
	pattern := globEscape(base) + ":*"
	var mu sync.Mutex
	count := func(ctx context.Context, r redis.Cmdable, sharded bool) error {
		subs, err := countSubscribers(ctx, r, pattern, sharded, t.channelKind)
		mu.Lock()
		defer mu.Unlock()
		for kind, k := range subs {
			recs[kind].Subscribers += k
		}
		return err
	}
	cc, ok := n.rdb.(*redis.ClusterClient)
	switch {
	case !ok:
		return count(ctx, n.rdb, false)
	case n.sharded(ctx):
		master, err := cc.MasterForKey(ctx, base)
		if err != nil {
			return err
		}
		return count(ctx, master, true)
	}
	return cc.ForEachShard(ctx, func(ctx context.Context, shard *redis.Client) error {
		return count(ctx, shard, false)
	})
}

// channelKind returns the index in AdminKinds of the lock whose channel ch
// is, or -1 for a channel of no lock of t (another name's, which the
// pattern P{N}:* may match: its key ends in '}' where ours go on, or its
// channel has a ':' after our infix, where a Client id has none).
func (t *AdminTarget) channelKind(ch string) int {
	for i := range AdminKinds {
		for _, home := range t.homes(i) {
			id, ok := strings.CutPrefix(ch, home+wire.ReleasedInfix)
			if ok && id != "" && !strings.Contains(id, ":") {
				return i
			}
		}
	}
	return -1
}

// countSubscribers adds up, per kind of lock, the subscribers of the
// channels that match pattern on one server (or, for a *redis.Client of a
// single deployment, on its server) and that kindOf says are a lock's.
func countSubscribers(ctx context.Context, r redis.Cmdable, pattern string, sharded bool, kindOf func(string) int) (map[int]int, error) {
	var chans []string
	var err error
	if sharded {
		chans, err = r.PubSubShardChannels(ctx, pattern).Result()
	} else {
		chans, err = r.PubSubChannels(ctx, pattern).Result()
	}
	chans = slices.DeleteFunc(chans, func(ch string) bool { return kindOf(ch) < 0 })
	if err != nil || len(chans) == 0 {
		return nil, err
	}
	var subs map[string]int64
	if sharded {
		subs, err = r.PubSubShardNumSub(ctx, chans...).Result()
	} else {
		subs, err = r.PubSubNumSub(ctx, chans...).Result()
	}
	counts := make(map[int]int)
	for ch, k := range subs {
		if kind := kindOf(ch); kind >= 0 {
			counts[kind] += int(k)
		}
	}
	return counts, err
}

// globEscape quotes the characters that Redis glob patterns treat
// specially, so that s matches itself only.
func globEscape(s string) string {
	if !strings.ContainsAny(s, `*?[]\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
