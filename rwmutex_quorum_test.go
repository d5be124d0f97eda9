package remutex

import (
	"testing"

	"github.com/remutex/remutex/internal/redistest"
)

// TestRWMutexQuorum: on a quorum of three servers, readers and writers of
// three Clients exclude each other: the basic exchange, then sync's hammer.
func TestRWMutexQuorum(t *testing.T) {
	t.Parallel()
	srvs := redistest.StartServers(t, 3)
	name := lockName(t)
	var cs []*Client
	for i := 0; i < 3; i++ {
		cs = append(cs, quorumClient(t, srvs))
	}
	checkRWExclusion(t, rwOn(cs, name), nil)
	hammerRWMutex(t, rwOn(cs, name+".hammer"), 3, 6)
}
