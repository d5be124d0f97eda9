package transport

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A cluster client learns that a master was failed over from a MOVED reply,
// or from its periodic reload of the slots (go-redis: once a minute by
// default). A dead master sends no MOVED: the calls for its slots fail at
// the connection until that reload, long after the cluster promoted its
// replica, and every hold there is lost. So a call that found no server
// answering asks the cluster client to reload its view now (go-redis does it
// in the background, coalescing requests).

// reloadAfter asks a cluster client to reload its view of the slots if err
// says a server could not be reached or did not answer in time, that the
// cluster is down, or that the slot moved: a call sent to a master directly
// (with WAIT, see masterFor) gets MOVED from a master that came back as a
// replica, and the cluster client never sees it.
func (n *node) reloadAfter(err error) {
	if !n.cluster || err == nil || errors.Is(err, context.Canceled) {
		return
	}
	var rerr redis.Error
	if errors.As(err, &rerr) && !strings.HasPrefix(rerr.Error(), "CLUSTERDOWN") && !strings.HasPrefix(rerr.Error(), "MOVED") {
		return
	}
	n.rdb.(*redis.ClusterClient).ReloadState(context.Background())
}
