package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// lockKeys are the Redis keys and channel of one lock, as the remutex package
// lays them out for prefix P and name N: all begin with P{N}, so they share a
// cluster slot.
type lockKeys struct {
	hash    string // owner token -> hold count
	fence   string // fencing counter
	queue   string // starvation queue: entry -> arrival
	alive   string // starvation queue: entry -> liveness deadline (server ms)
	channel string // release channel: "r" when released
}

func keysFor(prefix, name string) lockKeys {
	h := prefix + "{" + name + "}"
	return lockKeys{hash: h, fence: h + ":fence", queue: h + ":queue", alive: h + ":queue:alive", channel: h + ":released"}
}

// checkName reports why the remutex package would refuse name as a lock
// name, if it would: it is checked here, so that the library's panic for it
// never happens.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("the lock name is empty")
	case len(name) > remutex.MaxNameLen:
		return fmt.Errorf("the lock name is %d bytes long, more than %d", len(name), remutex.MaxNameLen)
	case strings.HasPrefix(name, "}"):
		return fmt.Errorf("lock name %q starts with '}': its keys would lose their shared hash tag", name)
	}
	return nil
}

// lockStatus is what status reports about one lock; it is also the JSON
// object of status --json.
type lockStatus struct {
	Name    string   `json:"name"`
	Key     string   `json:"key"`     // the lock's hash
	Held    bool     `json:"held"`    // some owner holds it
	Holders []holder `json:"holders"` // owner tokens and hold counts; [] when free
	// TTLMillis is the remaining lease in milliseconds: 0 when free, -1 if
	// the key has no expiry (not something remutex leaves).
	TTLMillis int64 `json:"ttl_ms"`
	// Fence is the last fencing token handed out (the counter P{N}:fence),
	// 0 if the lock was never taken with fencing.
	Fence int64 `json:"fence"`
	// Queued is the number of live waiters in the lock's queue in Redis
	// (starvation mode). Waiters that have not queued there are counted by
	// Subscribers instead.
	Queued int64 `json:"queued"`
	// Subscribers is the number of Clients subscribed to the lock's release
	// channel: those waiting for it, and for a fraction of a second those
	// that waited last.
	Subscribers int64  `json:"subscribers"`
	Error       string `json:"error,omitempty"` // why the lock could not be read
}

type holder struct {
	Owner string `json:"owner"` // <client id>:<goroutine id>
	Count int64  `json:"count"` // its hold count
}

// statusScript reads a lock's state in one atomic step. It writes nothing.
// KEYS = hash, fence, alive. Returns {fields of the hash, pttl, fence (an
// empty string if none), live queue entries}, or an error reply for a key of another type.
var statusScript = redis.NewScript(`
local function typeof(key)
  local t = redis.call('type', key)
  if type(t) == 'table' then t = t['ok'] end
  return t
end
local t = typeof(KEYS[1])
if t ~= 'none' and t ~= 'hash' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a remutex lock')
end
local fields = {}
if t == 'hash' then fields = redis.call('hgetall', KEYS[1]) end
local fence = ''
if typeof(KEYS[2]) == 'string' then fence = redis.call('get', KEYS[2]) end
local queued = 0
if typeof(KEYS[3]) == 'zset' then
  local now = redis.call('time')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  queued = redis.call('zcount', KEYS[3], '(' .. ms, '+inf')
end
return {fields, redis.call('pttl', KEYS[1]), fence, queued}
`)

// readStatus reads the state of lock name. A key of another type under the
// name is reported in Error, not as err; err is a failed Redis call.
func readStatus(ctx context.Context, rdb redis.UniversalClient, prefix, name string) (lockStatus, error) {
	k := keysFor(prefix, name)
	st := lockStatus{Name: name, Key: k.hash, Holders: []holder{}}
	v, err := statusScript.Run(ctx, rdb, []string{k.hash, k.fence, k.alive}).Slice()
	if err != nil {
		if redis.HasErrorPrefix(err, "WRONGTYPE") {
			st.Error = strings.TrimPrefix(err.Error(), "WRONGTYPE ")
			return st, nil
		}
		return st, fmt.Errorf("lock %q: %w", name, err)
	}
	if len(v) != 4 {
		return st, fmt.Errorf("lock %q: unexpected reply %v", name, v)
	}
	fields, _ := v[0].([]interface{})
	for i := 0; i+1 < len(fields); i += 2 {
		owner, _ := fields[i].(string)
		n, _ := strconv.ParseInt(fmt.Sprint(fields[i+1]), 10, 64)
		st.Holders = append(st.Holders, holder{Owner: owner, Count: n})
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].Owner < st.Holders[j].Owner })
	st.Held = len(st.Holders) > 0
	if st.Held {
		st.TTLMillis, _ = v[1].(int64)
		if st.TTLMillis < -1 {
			st.TTLMillis = 0
		}
	}
	if s, _ := v[2].(string); s != "" {
		st.Fence, _ = strconv.ParseInt(s, 10, 64)
	}
	st.Queued, _ = v[3].(int64)
	st.Subscribers, err = subscribers(ctx, rdb, k)
	if err != nil {
		return st, fmt.Errorf("lock %q: %w", name, err)
	}
	return st, nil
}

// subscribers counts the subscribers of the lock's release channel: on a
// Redis 7 cluster its shard channel on the master serving the lock's slot.
func subscribers(ctx context.Context, rdb redis.UniversalClient, k lockKeys) (int64, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		n, err := rdb.PubSubNumSub(ctx, k.channel).Result()
		return n[k.channel], err
	}
	master, err := cc.MasterForKey(ctx, k.hash)
	if err != nil {
		return 0, err
	}
	sharded, err := shardedPubSub(ctx, master)
	if err != nil {
		return 0, err
	}
	var n map[string]int64
	if sharded {
		n, err = master.PubSubShardNumSub(ctx, k.channel).Result()
	} else {
		n, err = master.PubSubNumSub(ctx, k.channel).Result()
	}
	return n[k.channel], err
}

// publishCommand returns the command that announces a release of the lock,
// as the remutex package sends it: SPUBLISH on a Redis 7 cluster, PUBLISH
// elsewhere.
func publishCommand(ctx context.Context, rdb redis.UniversalClient, k lockKeys) (string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return "publish", nil
	}
	master, err := cc.MasterForKey(ctx, k.hash)
	if err != nil {
		return "", err
	}
	sharded, err := shardedPubSub(ctx, master)
	if err != nil || !sharded {
		return "publish", err
	}
	return "spublish", nil
}

// shardedPubSub reports whether a cluster node runs Redis 7 or later, where
// remutex uses sharded pub/sub.
func shardedPubSub(ctx context.Context, node *redis.Client) (bool, error) {
	info, err := node.Info(ctx, "server").Result()
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			major, _, _ := strings.Cut(v, ".")
			n, err := strconv.Atoi(major)
			return err == nil && n >= 7, nil
		}
	}
	return false, errors.New("INFO server reports no redis_version")
}

// describeTTL renders a remaining lease for people.
func describeTTL(ms int64) string {
	if ms < 0 {
		return "no expiry"
	}
	d := time.Duration(ms) * time.Millisecond
	if d >= time.Second {
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}
