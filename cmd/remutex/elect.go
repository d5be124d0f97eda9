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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/remutex/remutex"
)

const electUsage = `Usage: remutex elect [flags] NAME --value VALUE [flags] -- COMMAND [ARGS...]

Campaigns in the election NAME (remutex.DistElection) with VALUE, and runs
COMMAND while this process leads: the candidates of every machine on the
same Redis lead one at a time, in the order in which they came, and
remutex leader NAME names the one that leads and its VALUE. When the
command exits, the term is resigned (the next candidate leads at once) and
remutex exits with the command's status.

The command gets the term's number, its fencing token, in $REMUTEX_TERM
and in the variable named by --fence-env (default REMUTEX_FENCE, as run's
fencing token): terms rise strictly from leader to leader, so storage that
refuses a number lower than the highest it has seen refuses a deposed
leader's writes.

The term is a lease renewed in the background (--lease): a leader that dies
leads until its lease ends, and then the next candidate leads. The command
runs as under remutex run, in a process group of its own watched by a
supervisor: signals sent to remutex are passed on to it; if the term is
lost (Redis unreachable until the lease is about to end, the key deleted or
force-released), the group gets SIGTERM, then SIGKILL after --grace, before
the lease can end in Redis and another candidate be elected, and remutex
exits with status 79; if remutex dies, the supervisor kills the group.

With --again, remutex campaigns again whenever the command exits or the
term is lost, and runs the command again in each new term, until it is
interrupted (SIGINT, SIGTERM, SIGHUP: passed on to a running command, after
which remutex exits with its status). After a command that failed (a
non-zero status), it waits a second before it campaigns again.

Exit status: the command's (128+N if signal N killed it); 64 usage error;
69 Redis error; 79 the term was lost while the command ran (not with
--again); 126 the command could not be executed; 127 the command was not
found; 128+N signal N ended the campaign (the command did not run).

Flags:
`

// retryPause is how long elect --again waits after a command that failed
// before it campaigns again: a command that fails at once does not restart
// in a loop.
const retryPause = time.Second

// electConfig is a parsed elect command line.
type electConfig struct {
	runConfig // name, command, lease, grace, fenceEnv
	value     optString
	again     bool
}

func (c *cli) elect(args []string) int {
	fs := c.flagSet("elect")
	cfg := electConfig{runConfig: runConfig{lease: remutex.DefaultLease, grace: 5 * time.Second}}
	fs.Var(&cfg.value, "value", "what this candidate publishes while it leads (remutex leader prints it): a `string`, such as its address; required")
	fs.BoolVar(&cfg.again, "again", false, "campaign again after the command exits or the term is lost, until interrupted")
	fs.Var((*durationValue)(&cfg.lease), "lease",
		"the term's lease: how long it outlives remutex if remutex dies, a `duration` from 50ms to 24h")
	fs.Var((*durationValue)(&cfg.grace), "grace",
		"how long the command's processes get between SIGTERM and SIGKILL when the term is lost or they outlive the command: a `duration`")
	fs.StringVar(&cfg.fenceEnv, "fence-env", "REMUTEX_FENCE",
		"environment `variable` that also gets the term's number (it is always in REMUTEX_TERM); empty: only REMUTEX_TERM")
	usage := func(w io.Writer) {
		fmt.Fprint(w, electUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	if code, ok := c.parse(fs, args, usage); !ok {
		return code
	}
	if code, ok := c.electArgs(fs, args, usage, &cfg); !ok {
		return code
	}
	return c.runElected(cfg)
}

// electArgs takes elect's positional arguments, NAME [flags] [--] COMMAND
// [ARGS...], into cfg (flags may also follow NAME, up to the "--") and
// checks them: it returns the usage error's exit status, or ok.
func (c *cli) electArgs(fs *flag.FlagSet, args []string, usage func(io.Writer), cfg *electConfig) (int, bool) {
	const synopsis = "(usage: remutex elect [flags] NAME --value VALUE -- COMMAND [ARGS...])"
	rest := fs.Args()
	switch {
	case endedByDashes(args, rest):
		return c.usageError("elect: no election name before -- %s", synopsis), false
	case len(rest) == 0:
		return c.usageError("elect: no election name %s", synopsis), false
	}
	cfg.name = rest[0]
	after := rest[1:]
	if code, ok := c.parse(fs, after, usage); !ok {
		return code, false
	}
	cfg.command = fs.Args()
	if !endedByDashes(after, cfg.command) {
		if i := slices.Index(cfg.command, "--"); i > 0 {
			return c.usageError("elect: %q between the election name %q and --: the command goes after --, flags before it %s",
				strings.Join(cfg.command[:i], " "), cfg.name, synopsis), false
		}
	}
	if len(cfg.command) == 0 {
		return c.usageError("elect: no command %s", synopsis), false
	}
	if !cfg.value.set {
		return c.usageError("elect: no --value: give what this candidate publishes while it leads, as in --value $(hostname) %s", synopsis), false
	}
	if err := cfg.check(false); err != nil {
		return c.usageError("elect: %v", err), false
	}
	if err := checkName(cfg.name); err != nil {
		return c.usageError("elect: %v", err), false
	}
	return 0, true
}

// runElected campaigns, runs the command in each term, and resigns.
func (c *cli) runElected(cfg electConfig) int {
	if err := exec.Command(cfg.command[0]).Err; err != nil {
		// Not found on PATH: say so before campaigning.
		c.errorf("%v", err)
		return exitNotFound
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	in := watchInterrupts(sigs)
	defer in.stop()

	rdb, err := c.connect(in.ctx)
	if err != nil {
		if sig := in.signal(); sig != nil {
			c.errorf("%v while connecting to Redis", sig)
			return 128 + signalNumber(sig)
		}
		return c.fail(err)
	}
	defer rdb.Close()
	locks := c.lockClient(rdb)
	defer locks.Close() // before rdb.Close
	e := locks.NewElection(cfg.name, remutex.WithLease(cfg.lease))
	for {
		err := e.Campaign(in.ctx, cfg.value.v)
		if sig := in.signal(); sig != nil {
			if err == nil {
				c.resign(e)
			}
			c.errorf("%v while campaigning in election %q; the command did not run", sig, cfg.name)
			return 128 + signalNumber(sig)
		}
		if err != nil {
			c.errorf("%v", err)
			return exitRedis
		}
		status, lost := c.lead(e, cfg, in)
		switch {
		case in.signal() != nil || !cfg.again:
			if lost {
				return exitLost
			}
			return status
		case lost:
			c.errorf("campaigning again in election %q (--again)", cfg.name)
		case status != 0:
			c.errorf("the command exited with status %d; campaigning again in election %q in %v (--again)", status, cfg.name, retryPause)
			in.sleep(retryPause) // a signal ends it, and the campaign below
		}
	}
}

// lead runs the command in e's term and resigns the term when it exits. It
// returns the command's exit status and whether the term was lost meanwhile.
func (c *cli) lead(e *remutex.DistElection, cfg electConfig, in *interrupts) (status int, lost bool) {
	term := e.Term()
	t := strconv.FormatInt(term, 10)
	cmd := exec.Command(cfg.command[0], cfg.command[1:]...)
	cmd.Env = append(os.Environ(), termEnv+"="+t)
	if cfg.fenceEnv != "" {
		cmd.Env = append(cmd.Env, cfg.fenceEnv+"="+t)
	}
	rc := cfg.runConfig
	rc.holding = fmt.Sprintf("term %d of election %q", term, cfg.name)
	status, lost = c.supervise(cmd, rc, in.toCommand, e.Lost())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch err := e.Resign(ctx); {
	case errors.Is(err, remutex.ErrLockLost):
		c.errorf("%v", err) // the cause of the loss
		return status, true
	case err != nil:
		c.errorf("resigning: %v (the term ends within its lease)", err)
	}
	return status, lost
}

// termEnv is the variable that gets the term's number.
const termEnv = "REMUTEX_TERM"

// resign resigns a term that will not be used.
func (c *cli) resign(e *remutex.DistElection) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Resign(ctx); err != nil {
		c.errorf("resigning: %v (the term ends within its lease)", err)
	}
}

// interrupts watches elect's signals for its whole run: the first one ends
// ctx (a campaign, a pause) and marks elect interrupted, and each one is
// also passed on through toCommand, which supervise reads while the command
// runs.
type interrupts struct {
	ctx       context.Context
	cancel    context.CancelFunc
	toCommand chan os.Signal

	mu    sync.Mutex
	first os.Signal

	quit, done chan struct{}
	stopOnce   sync.Once
}

// watchInterrupts starts watching sigs; stop ends it.
func watchInterrupts(sigs <-chan os.Signal) *interrupts {
	ctx, cancel := context.WithCancel(context.Background())
	in := &interrupts{ctx: ctx, cancel: cancel, toCommand: make(chan os.Signal, cap(sigs)),
		quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(in.done)
		for {
			select {
			case s := <-sigs:
				in.mu.Lock()
				if in.first == nil {
					in.first = s
				}
				in.mu.Unlock()
				in.cancel()
				select {
				case in.toCommand <- s:
				default: // as many as sigs holds are waiting already
				}
			case <-in.quit:
				return
			}
		}
	}()
	return in
}

// signal returns the first signal that came, or nil.
func (in *interrupts) signal() os.Signal {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.first
}

// sleep waits for d, or until a signal comes.
func (in *interrupts) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-in.ctx.Done():
	}
}

// stop stops the watching and joins its goroutine.
func (in *interrupts) stop() {
	in.stopOnce.Do(func() {
		close(in.quit)
		<-in.done
		in.cancel()
	})
}
