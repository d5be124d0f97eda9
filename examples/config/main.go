// Command config shows a DistRWMutex guarding a configuration that many
// processes read and one rewrites: readers share the lock, the writer
// excludes them, and no reader ever sees a half-written configuration.
//
// The configuration is a Redis hash whose fields "a" and "b" must both name
// its "version". The writer rewrites it field by field, a millisecond apart,
// as a real update of several keys would; a reader that reads between two of
// those writes sees a torn configuration. Readers run on 4 Clients (each with
// its own connection pool, standing for a process) × 8 goroutines, the
// writer on a fifth. It runs once without a lock and once with a
// DistRWMutex, and reports torn reads, how many readers held the lock at once,
// and how long the writer waited (writers are preferred: readers that come
// while it waits queue behind it).
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/config
//	go run ./examples/config -writes 50 -readers 16
//
// It exits with status 1 if a reader saw a torn configuration under the lock.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// config is one run.
type config struct {
	clients int           // reader Clients
	readers int           // reader goroutines per Client
	writes  int           // rewrites of the configuration
	gap     time.Duration // between two field writes of one rewrite
	every   time.Duration // between rewrites
}

func main() {
	cfg := config{}
	flag.IntVar(&cfg.clients, "clients", 4, "reader Clients")
	flag.IntVar(&cfg.readers, "readers", 8, "reader goroutines per Client")
	flag.IntVar(&cfg.writes, "writes", 30, "rewrites of the configuration")
	flag.DurationVar(&cfg.gap, "gap", time.Millisecond, "pause between the field writes of one rewrite")
	flag.DurationVar(&cfg.every, "every", 5*time.Millisecond, "pause between rewrites")
	flag.Parse()
	locked, err := run(context.Background(), os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "config:", err)
		os.Exit(2)
	}
	if !locked.ok() {
		os.Exit(1)
	}
}

// outcome is what one pass saw.
type outcome struct {
	reads, torn int64
	maxInside   int64           // readers inside at once, at most
	writerWaits []time.Duration // Lock called → held
	took        time.Duration
}

// ok reports a clean locked pass: reads happened, none torn.
func (o *outcome) ok() bool { return o.torn == 0 && o.reads > 0 }

// run does both passes on the Redis at addr (an embedded miniredis if
// empty), prints what they saw, and returns the locked pass's outcome.
func run(ctx context.Context, w io.Writer, cfg config, addr string) (*outcome, error) {
	where := "Redis at " + addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return nil, err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(w, "config:     %d rewrites (fields written %v apart), read by %d clients × %d goroutines\n",
		cfg.writes, cfg.gap, cfg.clients, cfg.readers)
	fmt.Fprintf(w, "redis:      %s\n", where)
	free, err := pass(ctx, cfg, addr, false)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "no lock:    %d reads, %d torn (%v)\n", free.reads, free.torn, free.took.Round(time.Millisecond))
	locked, err := pass(ctx, cfg, addr, true)
	if err != nil {
		return nil, err
	}
	slices.Sort(locked.writerWaits)
	fmt.Fprintf(w, "RWMutex:    %d reads, %d torn, up to %d readers at once, writer waited p50 %v max %v (%v)\n",
		locked.reads, locked.torn, locked.maxInside, pick(locked.writerWaits, 0.5), pick(locked.writerWaits, 1),
		locked.took.Round(time.Millisecond))
	switch {
	case !locked.ok():
		fmt.Fprintf(w, "verdict:    FAILED: readers saw %d torn configurations under the lock\n", locked.torn)
	case free.torn > 0:
		fmt.Fprintf(w, "verdict:    ok: no torn read under the lock; without it %d of %d reads were torn\n", free.torn, free.reads)
	default:
		fmt.Fprintf(w, "verdict:    ok: no torn read under the lock (this time no read was torn without it either)\n")
	}
	return locked, nil
}

func pick(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))].Round(10 * time.Microsecond)
}
