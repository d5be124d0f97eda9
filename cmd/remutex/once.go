package main

import (
	"context"
	"errors"
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
	if code, ok := c.commandArgs("once", "once", fs, args, &cfg.runConfig); !ok {
		return code
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

	stop, watched chan struct{} // the signal watcher's (see watch)
	stopOnce      sync.Once
}

// watch ends the wait at the first signal of sigs, until stopWatching;
// a signal that comes once the run started goes back to sigs, for
// supervise to pass on to the command.
func (b *beforeRun) watch(sigs chan os.Signal) {
	b.stop, b.watched = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(b.watched)
		select {
		case s := <-sigs:
			if !b.end(s) {
				sigs <- s
			}
		case <-b.stop:
		}
	}()
}

// stopWatching stops the watcher started by watch and waits for it.
func (b *beforeRun) stopWatching() {
	b.stopOnce.Do(func() { close(b.stop); <-b.watched })
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
	pre.watch(sigs)
	defer pre.stopWatching()

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
	var out commandRun
	err = o.Do(ctx, func(hctx context.Context) error {
		if !pre.start() {
			return errWaitOver
		}
		pre.stopWatching()
		return c.runCommand(hctx, cmd, cfg, sigs, o.Fence(), &out)
	})
	return c.onceExit(err, out, pre, cfg)
}

// commandRun is what became of the command, if this caller ran it.
type commandRun struct {
	ran    bool
	status int
}

// runCommand runs the command as the once's run, as run would, with the
// run's fencing token; its error is the run's failure, as the waiters see
// it.
func (c *cli) runCommand(hctx context.Context, cmd *exec.Cmd, cfg onceConfig, sigs chan os.Signal, fence int64, out *commandRun) error {
	out.ran = true
	if cfg.fenceEnv != "" {
		cmd.Env = append(os.Environ(), cfg.fenceEnv+"="+strconv.FormatInt(fence, 10))
	}
	var lostSeen bool
	out.status, lostSeen = c.supervise(cmd, cfg.runConfig, sigs, hctx.Done())
	switch {
	case lostSeen:
		return fmt.Errorf("the lease was lost while the command ran (it exited with status %d)", out.status)
	case out.status != 0:
		return fmt.Errorf("the command exited with status %d", out.status)
	}
	return nil
}

// onceExit is the exit status of a once whose Do returned err.
func (c *cli) onceExit(err error, out commandRun, pre *beforeRun, cfg onceConfig) int {
	var oe *remutex.OnceError
	switch {
	case err == nil:
		return exitOK
	case out.ran && errors.Is(err, remutex.ErrLockLost):
		c.errorf("%v", err)
		return exitLost
	case out.ran && out.status != 0:
		return out.status
	case out.ran:
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
