package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// The commands read and free locks through the remutex package
// (Client.Inspect and Client.ForceUnlock): they know nothing of its keys,
// channels or scripts.

// lockClient returns a remutex Client on rdb with the locks' key prefix,
// logging its warnings to stderr, and opts. The caller closes it before rdb.
func (c *cli) lockClient(rdb redis.UniversalClient, opts ...remutex.Option) *remutex.Client {
	return remutex.NewClient(rdb, append([]remutex.Option{
		remutex.WithKeyPrefix(c.conn.keyPrefix()),
		remutex.WithLogger(slog.New(&lineHandler{w: c.stderr, mu: new(sync.Mutex)})),
	}, opts...)...)
}

// checkName says why name is not a lock name, without the "remutex: " the
// messages here carry already; nil for a valid name.
func checkName(name string) error {
	if err := remutex.CheckName(name); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "remutex: "))
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
	// Fence is the last fencing token handed out, 0 if the lock was never
	// taken with fencing.
	Fence int64 `json:"fence"`
	// Queued is the number of live waiters in the lock's queue in Redis.
	Queued int64 `json:"queued"`
	// Subscribers is the number of Clients listening for the lock's
	// messages: those waiting for it, and for a fraction of a second those
	// that waited last.
	Subscribers int64  `json:"subscribers"`
	Error       string `json:"error,omitempty"` // why the lock could not be read
}

type holder struct {
	Owner string `json:"owner"` // <client id>:<goroutine id>
	Count int64  `json:"count"` // its hold count
	Host  string `json:"host"`  // host of the holder's process
	PID   int    `json:"pid"`   // its process id
}

// readStatus reads the state of lock name. A key of another type under the
// name is reported in Error, not as err; err is a failed Redis call.
func readStatus(ctx context.Context, locks *remutex.Client, name string) (lockStatus, error) {
	info, err := locks.Inspect(ctx, name)
	var wt *remutex.WrongTypeError
	if errors.As(err, &wt) {
		return lockStatus{Name: name, Key: info.Key, Holders: []holder{}, Error: strings.TrimPrefix(wt.Error(), "remutex: ")}, nil
	}
	if err != nil {
		return lockStatus{}, err
	}
	st := lockStatus{
		Name:        name,
		Key:         info.Key,
		Held:        len(info.Holders) > 0,
		Holders:     make([]holder, len(info.Holders)),
		Fence:       info.Fence,
		Queued:      int64(len(info.Waiters)),
		Subscribers: int64(info.Subscribers),
	}
	for i, h := range info.Holders {
		st.Holders[i] = holder{Owner: h.Owner, Count: int64(h.Count), Host: h.Host, PID: h.PID}
	}
	switch {
	case info.TTL < 0:
		st.TTLMillis = -1
	case st.Held:
		st.TTLMillis = info.TTL.Milliseconds()
	}
	return st, nil
}

// describe says who a holder is, for people.
func (h holder) describe() string {
	if h.Host == "" {
		return h.Owner
	}
	return fmt.Sprintf("%s (pid %d on %s)", h.Owner, h.PID, h.Host)
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
