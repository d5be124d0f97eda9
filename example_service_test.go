package remutex_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// reindex is the README service's job; the example below sets it.
var reindex func(ctx context.Context) error

// serviceWorker is the README's worker ("In a service"), with its job run
// directly where the README starts it in an errgroup: it runs jobs until
// sigterm ends, and a job that runs then finishes, since its context
// outlives the signal (it ends only if the hold is lost).
func serviceWorker(sigterm context.Context, m *remutex.DistMutex) {
	jobs := context.WithoutCancel(sigterm)
	for sigterm.Err() == nil {
		err := m.Do(jobs, func(ctx context.Context) error { // ctx ends if the hold is lost
			return reindex(ctx)
		})
		if errors.Is(err, remutex.ErrClosed) {
			return // shut down while waiting for the lock
		}
	}
}

// A service that shuts down on SIGTERM lets the job that runs finish: the
// job's context outlives the signal, and Shutdown waits for its hold to end
// before it closes the Client. (Here a cancel stands for the signal.)
func ExampleClient_Shutdown_service() {
	addr, stop := exampleRedis()
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := remutex.NewClient(rdb)

	sigterm, signal := context.WithCancel(context.Background()) // signal.NotifyContext in a service
	running := make(chan struct{})
	reindex = func(ctx context.Context) error {
		close(running)
		<-sigterm.Done() // the signal comes while the job runs
		fmt.Println("the job, after the signal: its context", ctx.Err())
		return nil
	}
	done := make(chan struct{})
	go func() { defer close(done); serviceWorker(sigterm, locks.NewMutex("jobs:reindex")) }()

	<-running
	signal()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println("Shutdown:", locks.Shutdown(shutdown))
	<-done
	// Output:
	// the job, after the signal: its context <nil>
	// Shutdown: <nil>
}

// TestREADMEServiceJobsOutliveTheSignal: the README's service example gives
// m.Do a context that outlives SIGTERM (as serviceWorker above does, which
// the example runs), not the signal's own, since its comment says that the
// current jobs finish.
func TestREADMEServiceJobsOutliveTheSignal(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "### In a service\n")
	block, _, _ := strings.Cut(section, "\n```\n")
	sig := regexp.MustCompile(`(\w+), \w+ := signal\.NotifyContext`).FindStringSubmatch(block)
	do := regexp.MustCompile(`m\.Do\((\w+),`).FindStringSubmatch(block)
	switch {
	case sig == nil || do == nil:
		t.Fatalf("README's service example: no signal.NotifyContext or m.Do found in:\n%s", block)
	case do[1] == sig[1] || do[1] == "ctx":
		t.Errorf("README's service example passes m.Do the signal's context (%s): a running job's context ends at SIGTERM, though the current jobs are to finish", do[1])
	case !strings.Contains(block, do[1]+" := context.WithoutCancel("+sig[1]+")"):
		t.Errorf("README's service example: m.Do's context %s is not context.WithoutCancel(%s), as serviceWorker's is", do[1], sig[1])
	case !strings.Contains(block, "errors.Is(err, remutex.ErrDegraded)"):
		t.Errorf("README's service example: Check's error is not tested for ErrDegraded, so a service that works degraded is refused")
	}
}
