package remutex

import (
	"testing"
	"time"

	"github.com/remutex/remutex/internal/redistest"
)

// BenchmarkTopologyLockUnlock measures one uncontended Lock+Unlock cycle on
// each deployment, started by the benchmark on 127.0.0.1: a single
// redis-server; a cluster of three masters; a primary with a replica and
// WithReplicaAck(1, 100ms); quorums of three and of five servers. Compare
// each with single for the cost of the topology.
func BenchmarkTopologyLockUnlock(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		srv := redistest.Start(b)
		benchTopologyCycle(b, clientOn(b, rdbAt(b, srv.Addr())))
	})
	b.Run("cluster-3", func(b *testing.B) {
		tc := redistest.StartCluster(b, 3, 0)
		benchTopologyCycle(b, clientOn(b, tc.Client(b)))
	})
	b.Run("replica-ack", func(b *testing.B) {
		p := redistest.StartReplicaPair(b, false)
		benchTopologyCycle(b, clientOn(b, rdbAt(b, p.Primary.Addr()), WithReplicaAck(1, 100*time.Millisecond)))
	})
	for _, n := range []int{3, 5} {
		b.Run("quorum-"+string(rune('0'+n)), func(b *testing.B) {
			benchTopologyCycle(b, quorumClient(b, redistest.StartServers(b, n)))
		})
	}
}

// benchTopologyCycle times Lock+Unlock of one mutex of c, after one cycle
// that loads the scripts and opens the connections.
func benchTopologyCycle(b *testing.B, c *Client) {
	m := c.NewMutex(lockName(b))
	m.Lock()
	m.Unlock()
	b.ReportAllocs()
	for b.Loop() {
		m.Lock()
		m.Unlock()
	}
}
