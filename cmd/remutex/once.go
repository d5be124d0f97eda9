package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"time"

	"github.com/remutex/remutex"
)

const onceUsage = `Usage: remutex once [flags] NAME -- COMMAND [ARGS...]

Runs COMMAND once across every caller of NAME (remutex.DistOnce): the first
caller anywhere runs it while its lease is renewed; every other caller, on
any machine, waits for that run and exits with its outcome; once a run has
succeeded (exit status 0), every later caller exits 0 at once without
running anything. The success is kept in Redis without expiry (remutex
status NAME shows it; remutex.DistOnce.Reset clears it). This is the
init-container pattern: each pod runs "remutex once migrate-v42 --
./migrate up", and one of them migrates while the others wait.

If the run fails (the command exits non-zero or is killed), nothing is
recorded: the runner exits with the command's status, the callers that
waited for that run exit 80 without running it, and the next remutex once
NAME runs the command again (an init container that exits 80 is restarted
by Kubernetes, and its next try runs it). If the runner dies or is cut off
from Redis, its lease (--lease) ends and one waiter runs the command
instead.

The command runs as under remutex run: in a process group of its own, with
signals passed on, stopped (SIGTERM, then SIGKILL after --grace) if the
lease is lost, with the fencing token in --fence-env.

Exit status: 0 done (by this run, another, or before); the command's own
status when this caller ran it and it failed; 64 usage error; 69 Redis
error (also a record key holding data remutex did not write); 75 --wait
passed before the run ended (nothing ran here); 79 the lease was lost while
the command ran (nothing is recorded); 80 the run this caller waited for,
another caller's, failed (nothing ran here); 126 the command could not be
executed; 127 the command was not found.

Flags:
`

// exitRunFailed is once's status when the run it waited for failed.
const exitRunFailed = 80

// onceConfig is a parsed once command line.
type onceConfig struct {
	runConfig
}

func (c *cli) once(args []string) int {
	fs := c.flagSet("once")
	cfg := onceConfig{runConfig{lease: remutex.DefaultLease, grace: 5 * time.Second}}
	fs.Var((*durationValue)(&cfg.lease), "lease",
		"the run's lease: how long the others wait for a runner that died, a `duration` from 50ms to 24h")
	fs.Var(&cfg.wait, "wait", "how long to wait for the run to end (or to start it): a `duration`, or forever (default forever)")
	fs.Var((*durationValue)(&cfg.grace), "grace",
		"how long the command's processes get between SIGTERM and SIGKILL when the lease is lost or they outlive the command: a `duration`")
	fs.StringVar(&cfg.fenceEnv, "fence-env", "REMUTEX_FENCE",
		"environment `variable` that gets the run's fencing token; empty: no fencing")
	if code, ok := c.parse(fs, args, func(w io.Writer) {
		fmt.Fprint(w, onceUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}); !ok {
		return code
	}
	err := cfg.positional(fs.Args())
	if endedByDashes(args, fs.Args()) {
		err = errors.New("no once name before --")
	}
	if err != nil {
		return c.usageError("once: %v (usage: remutex once [flags] NAME -- COMMAND [ARGS...])", err)
	}
	leaseSet := false
	fs.Visit(func(f *flag.Flag) { leaseSet = leaseSet || f.Name == "lease" })
	if err := cfg.check(leaseSet); err != nil {
		return c.usageError("once: %v", err)
	}
	if err := checkName(cfg.name); err != nil {
		return c.usageError("once: %v", err)
	}
	if cfg.wait.set && cfg.wait.d == 0 {
		return c.usageError("once: --wait 0: a once waits for the run under way; give it time, as in --wait 10m")
	}
	return c.runOnce(cfg)
}

// errWaitOver is f's error when --wait or a signal ended the wait just as
// the run was granted: nothing ran, and the run counts as failed.
var errWaitOver = errors.New("the wait ended (--wait or a signal) as the run was granted: the command did not run")

// beforeRun ends the wait for the run (ctx) on --wait or a signal, until
// the run starts; from then on signals go to the command.
type beforeRun struct {
	mu      sync.Mutex
	started bool
	ended   os.Signal // the signal that ended the wait
	expired bool      // --wait ended it
	cancel  context.CancelFunc
}

// end ends the wait unless the run started.
func (b *beforeRun) end(sig os.Signal) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return false
	}
	if sig != nil && b.ended == nil {
		b.ended = sig
	} else if sig == nil {
		b.expired = true
	}
	b.cancel()
	return true
}

// start marks the run started, unless the wait ended first.
func (b *beforeRun) start() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended != nil || b.expired {
		return false
	}
	b.started = true
	return true
}

// runOnce runs the command once across NAME's callers, or waits for the run.
func (c *cli) runOnce(cfg onceConfig) int {
	cmd := exec.Command(cfg.command[0], cfg.command[1:]...)
	if cmd.Err != nil {
		c.errorf("%v", cmd.Err)
		return exitNotFound
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pre := &beforeRun{cancel: cancel}
	if cfg.wait.set {
		t := time.AfterFunc(cfg.wait.d, func() { pre.end(nil) })
		defer t.Stop()
	}
	// Until the command starts, a signal ends the wait; after, supervise
	// passes signals on.
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case s := <-sigs:
			if !pre.end(s) {
				sigs <- s // the run started meanwhile: the command's
			}
		case <-stop:
		}
	}()
	var stopOnce sync.Once
	stopWatching := func() {
		stopOnce.Do(func() { close(stop); <-watched })
	}
	defer stopWatching()

	rdb, err := c.connect(ctx)
	if err != nil {
		return c.onceEnded(pre, cfg, err)
	}
	defer rdb.Close()
	locks := c.lockClient(rdb)
	defer locks.Close()
	opts := []remutex.MutexOption{remutex.WithLease(cfg.lease)}
	if cfg.fenceEnv != "" {
		opts = append(opts, remutex.WithFencing())
	}
	o := locks.NewOnce(cfg.name, opts...)

	ran, status := false, 0
	err = o.Do(ctx, func(hctx context.Context) error {
		if !pre.start() {
			return errWaitOver
		}
		stopWatching()
		ran = true
		if cfg.fenceEnv != "" {
			cmd.Env = append(os.Environ(), cfg.fenceEnv+"="+strconv.FormatInt(o.Fence(), 10))
		}
		var lostSeen bool
		status, lostSeen = c.supervise(cmd, cfg.runConfig, sigs, hctx.Done())
		switch {
		case lostSeen:
			return fmt.Errorf("the lease was lost while the command ran (it exited with status %d)", status)
		case status != 0:
			return fmt.Errorf("the command exited with status %d", status)
		}
		return nil
	})
	var oe *remutex.OnceError
	switch {
	case err == nil:
		return exitOK
	case ran && errors.Is(err, remutex.ErrLockLost):
		c.errorf("%v", err)
		return exitLost
	case ran && status != 0:
		return status
	case ran:
		// The command succeeded, but its release (which records it) failed.
		c.errorf("the command succeeded, but recording it failed (the next remutex once %s may run it again): %v", cfg.name, err)
		return exitRedis
	case errors.As(err, &oe):
		c.errorf("once %q: the run on host %s (pid %d) failed after %v: %s; the command did not run here (the next remutex once %s runs it again)",
			cfg.name, oe.Host, oe.PID, oe.Duration.Round(time.Millisecond), oe.Message, cfg.name)
		return exitRunFailed
	}
	return c.onceEnded(pre, cfg, err)
}

// onceEnded is the exit status of a once that ran nothing and ended with
// err: a signal, --wait, or a Redis error.
func (c *cli) onceEnded(pre *beforeRun, cfg onceConfig, err error) int {
	pre.mu.Lock()
	sig, expired := pre.ended, pre.expired
	pre.mu.Unlock()
	switch {
	case sig != nil:
		c.errorf("%v while waiting for once %q; the command did not run here", sig, cfg.name)
		return 128 + signalNumber(sig)
	case expired:
		c.errorf("once %q: gave up after --wait %v; the command did not run here", cfg.name, cfg.wait.d)
		return exitTimeout
	}
	return c.fail(err)
}
