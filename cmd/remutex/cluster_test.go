//go:build unix

package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
	"github.com/remutex/remutex/internal/redistest"
)

// startCluster starts a one-node Redis Cluster that serves every slot.
func startCluster(t *testing.T) *redisServer {
	t.Helper()
	v := redistest.ServerVersion(t)
	port, err := redistest.FreePortWithBus(v) // Redis 6.2 has no cluster-port: its bus is port+10000
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startRedisOn(redistest.Require(t, "redis-server"), t.TempDir(), port, redistest.ClusterArgs(v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.stop)
	rdb := rdbFor(t, srv.addr())
	ctx := context.Background()
	slots := []interface{}{"cluster", "addslots"} // not ADDSLOTSRANGE: Redis 6.2 has no such command
	for slot := 0; slot < 16384; slot++ {
		slots = append(slots, slot)
	}
	if err := rdb.Do(ctx, slots...).Err(); err != nil {
		t.Fatal(err)
	}
	await(t, 30*time.Second, "the cluster to be ready", func() bool {
		info, err := rdb.ClusterInfo(ctx).Result()
		return err == nil && strings.Contains(info, "cluster_state:ok")
	})
	return srv
}

// TestCluster runs a holder and a waiter on a Redis 7 cluster, where release
// messages are shard messages: status counts the waiter's SSUBSCRIBE, and
// unlock --force tells the waiter's Client with SPUBLISH, which wakes it.
// On Redis 6.2, without sharded pub/sub, the same goes by SUBSCRIBE and
// PUBLISH.
func TestCluster(t *testing.T) {
	t.Parallel()
	srv := startCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.addr()}})
	t.Cleanup(func() { _ = cc.Close() })
	name := lockName(t, "lock")
	flags := []string{"--cluster", srv.addr()}

	holder, _, _ := holdLock(t, "", name, append(flags, "--lease", "2s")...)
	waiter := start(t, cliEnv(), "", append(flags, "run", name, "--", "true")...)
	await(t, 10*time.Second, "the waiter to queue and subscribe", func() bool {
		st := lockStateOn(t, cc, name)
		return st.Queued == 1 && st.Subscribers == 1
	})

	// The waiter's Client listens on the lock's channel for its Client id,
	// the part of its owner token before the ':'.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	locks := remutex.NewClient(cc)
	defer locks.Close()
	info, err := locks.Inspect(ctx, name)
	if err != nil || len(info.Waiters) != 1 {
		t.Fatalf("Inspect: got %+v, %v; want one waiter", info, err)
	}
	clientID, _, _ := strings.Cut(info.Waiters[0].Owner, ":")
	channel := "remutex:{" + name + "}:released:" + clientID
	var ps *redis.PubSub
	if redistest.ServerVersion(t).ShardedPubSub() {
		ps = cc.SSubscribe(context.Background(), channel)
	} else {
		ps = cc.Subscribe(context.Background(), channel) // Redis 6.2: the release PUBLISHes
	}
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := run(t, cliEnv(), "", append([]string{"unlock", "--force", "--yes", name}, flags...)...)
	if code != 0 {
		t.Fatalf("unlock: exit status %d, want 0; stdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	assertReleaseMessage(t, ps.Channel())
	if code := waiter.wait(30 * time.Second); code != 0 {
		t.Errorf("waiter: exit status %d, want 0; stderr:\n%s", code, waiter.stderr())
	}
	if code := holder.wait(30 * time.Second); code != exitLost {
		t.Errorf("holder: exit status %d, want %d; stderr:\n%s", code, exitLost, holder.stderr())
	}
}
