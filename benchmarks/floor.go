package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorResult is the cost of one round trip: PING answered on the same
// connection, one after the other, measured in every round of the
// uncontended scenario next to the libraries.
type floorResult struct {
	RTT      time.Duration // go-redis Client.Ping: median of the rounds' means
	P50      time.Duration // go-redis, over all pings
	Raw      time.Duration // PING written and read on a bare socket: median of the rounds' means
	RawP50   time.Duration
	Pings    int
	rounds   []time.Duration
	rawRound []time.Duration
	lat, raw []time.Duration
}

// floorRound measures PINGs for d: half through go-redis, half on a bare
// socket.
func floorRound(addr string, d time.Duration, r *floorResult) error {
	var w wire
	rdb := goRedis(config{addr: addr, wire: &w})
	defer rdb.Close()
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		if err := rdb.Ping(ctx).Err(); err != nil {
			return err
		}
	}
	n0 := len(r.lat)
	start := time.Now()
	for end := start.Add(d / 2); time.Now().Before(end); {
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return err
		}
		r.lat = append(r.lat, time.Since(t0))
	}
	r.rounds = append(r.rounds, time.Since(start)/time.Duration(len(r.lat)-n0))

	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ping := []byte("*1\r\n$4\r\nPING\r\n")
	one := func() error {
		if _, err := c.Write(ping); err != nil {
			return err
		}
		line, err := br.ReadString('\n')
		if err != nil {
			return err
		}
		if line != "+PONG\r\n" {
			return fmt.Errorf("PING answered %q", line)
		}
		return nil
	}
	for i := 0; i < 100; i++ {
		if err := one(); err != nil {
			return err
		}
	}
	n0 = len(r.raw)
	start = time.Now()
	for end := start.Add(d / 2); time.Now().Before(end); {
		t0 := time.Now()
		if err := one(); err != nil {
			return err
		}
		r.raw = append(r.raw, time.Since(t0))
	}
	r.rawRound = append(r.rawRound, time.Since(start)/time.Duration(len(r.raw)-n0))
	return nil
}

func (r *floorResult) finish() {
	r.Pings = len(r.lat) + len(r.raw)
	r.RTT, r.Raw = median(r.rounds), median(r.rawRound)
	slices.Sort(r.lat)
	slices.Sort(r.raw)
	r.P50, r.RawP50 = percentile(r.lat, 0.5), percentile(r.raw, 0.5)
	r.lat, r.raw = nil, nil
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// pingFloor is the floor as a variant, for counting instructions: its lock
// and its unlock are a PING each, on a go-redis client with default options,
// so that the harness that counts a library's cycle counts two round trips
// the same way.
func pingFloor() variant {
	return variant{name: floorName, lib: "go-redis", setup: "PING, PING", connect: func(cfg config) (client, error) {
		return pingClient{goRedis(cfg)}, nil
	}}
}

const floorName = "2 PINGs"

// pingClient is both the floor's client and its only mutex.
type pingClient struct{ rdb *redis.Client }

func (p pingClient) mutex(string) mutex                        { return p }
func (p pingClient) close()                                    { _ = p.rdb.Close() }
func (p pingClient) lock(ctx context.Context) error            { return p.rdb.Ping(ctx).Err() }
func (p pingClient) unlock(ctx context.Context) error          { return p.rdb.Ping(ctx).Err() }
func (p pingClient) tryLock(ctx context.Context) (bool, error) { return true, p.rdb.Ping(ctx).Err() }
func (p pingClient) lost() bool                                { return false }
