package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/remutex/remutex"
)

const runUsage = `Usage: remutex run [flags] NAME -- COMMAND [ARGS...]

Takes the lock NAME, waiting for it up to --wait, and runs COMMAND while the
lease is renewed in the background. The command gets the fencing token in the
environment (--fence-env). When the command exits, the lock is released and
remutex exits with the command's status (128+N if signal N killed it).

The lock is a mutex (remutex.DistMutex): one run at a time. With --read or
--write it is instead the read/write lock of that name (remutex.DistRWMutex,
independent of the mutex): any number of --read runs at once, or one --write
run, and readers that come while a writer waits queue behind it. A --read
run's fencing token is that of the latest write (0 before any). With
--permits N it is instead the semaphore NAME of N permits
(remutex.DistSemaphore, independent of the other two): each run holds one
permit, so at most N runs of it run their commands at once, wherever they
are; the others queue, first come first served. Every run of a semaphore
must give the same N (the size is kept in Redis; a run with another N is
refused with status 64). A run's fencing token is that of its own
acquisition. --permits goes with --lease or --max-hold, --wait, --grace and
--fence-env; not with --read, --write or --min-hold.

For a scheduled job that runs on several machines (the same cron line on
each), --min-hold keeps the lock taken until that long after it was taken,
even if the command was done sooner, so that the runners whose clocks or
schedulers are late find it taken: with --wait 0 they skip the tick, and the
job runs once per tick. Choose it longer than the clocks' skew and shorter
than the tick; it is a mutex's option (not with --read or --write). While it
holds, status shows the lock as kept. --max-hold D bounds the hold instead
of renewing it: the lease is D, fixed, so a runner that dies frees the job
after D at most, and a command still running at D is stopped as after any
lost lease (below), since letting it run on unlocked would let the next run
in beside it. It replaces --lease, and --min-hold must not exceed it:

  remutex run --wait 0 --min-hold 30s --max-hold 10m nightly-report -- ./report.sh

The command runs in a process group of its own, watched by a second remutex
process (the supervisor), so that what the command starts goes with it:
  - SIGINT, SIGTERM and SIGHUP sent to remutex are passed on to the group,
    also when remutex was started with them ignored (nohup): the command gets
    default signal dispositions. To survive a hangup, use
    remutex run NAME -- nohup COMMAND.
  - If the lease is lost (with --max-hold: when it runs out, a little before
    D by remutex's clock, so that Redis still holds the lock), the group gets
    SIGTERM, then SIGKILL after --grace, and remutex exits with status 79.
  - When the command exits, processes it left running in the group get
    SIGTERM, then SIGKILL after --grace; the lock is released only once the
    group is empty.
  - If remutex dies, even of SIGKILL, the supervisor kills the group with
    SIGKILL at once.
This holds on Linux (the supervisor also has a parent-death signal there);
elsewhere it is best effort. A process that leaves the group on purpose
(setsid, setpgid: daemons do) escapes it, and a remutex that is frozen
(SIGSTOP) cannot stop its command when the lease runs out.

On a terminal the command's group is the foreground group while it runs: it
can read the terminal, and Ctrl-C reaches it once. Ctrl-Z is not supported.

Exit status: the command's; 64 usage error (also a --permits that is not the
semaphore's size); 69 Redis error; 75 --wait passed while the lock was held
(no permit was free; the command did not run); 79 lease lost, or
--max-hold reached; 126 the command could not be executed; 127 the command
was not found.

Flags:
`

// Signals passed on to the command; SIGTERM and SIGKILL stop it after a lost
// lease.
var (
	forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}
	sigTerm   = os.Signal(syscall.SIGTERM)
	sigKill   = os.Signal(syscall.SIGKILL)
)

// waitFlag is --wait: a duration, or forever when not given.
type waitFlag struct {
	d   time.Duration
	set bool
}

func (w *waitFlag) String() string {
	if w == nil || !w.set {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	if s == "forever" {
		*w = waitFlag{}
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*w = waitFlag{d: d, set: true}
	return nil
}

// durationValue is a time.Duration flag whose errors say what is wrong.
type durationValue time.Duration

func (d *durationValue) String() string { return (*time.Duration)(d).String() }

func (d *durationValue) Set(s string) error {
	v, err := parseDuration(s)
	*d = durationValue(v)
	return err
}

// parseDuration is time.ParseDuration with errors for people: a number
// without a unit is the usual mistake.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return 0, fmt.Errorf("a duration needs a unit, as in %ss", s)
	}
	return 0, errors.New("not a duration: want a number with a unit, as in 30s, 1m30s or 500ms")
}

// runConfig is a parsed run command line.
type runConfig struct {
	name     string
	command  []string
	lease    time.Duration
	wait     waitFlag
	grace    time.Duration
	fenceEnv string
	read     bool // --read: the read lock of the read/write lock NAME
	write    bool // --write: its write lock
	// minHold is --min-hold: the lock stays taken until this long after it
	// was taken (remutex.WithMinHold); 0, the default: free at once.
	minHold time.Duration
	// maxHold is --max-hold: a fixed lease of this length, not renewed
	// (remutex.WithLease and WithoutRenewal), in place of lease; 0, the
	// default: lease, renewed while the command runs.
	maxHold time.Duration
	// permits is --permits: the size of the semaphore NAME, of which the run
	// takes one permit; 0, the default: a mutex (or --read, --write).
	permits permitsFlag
	// holding names, in supervise's messages, what the command runs under
	// (elect: a term of an election); "", the default: the lease of lock
	// NAME.
	holding string
}

// kind is the kind of lock cfg takes.
func (cfg *runConfig) kind() string {
	switch {
	case cfg.permits > 0:
		return kindSemaphore
	case cfg.read || cfg.write:
		return kindRWMutex
	}
	return kindMutex
}

// options are the options of the lock cfg takes.
func (cfg *runConfig) options() []remutex.MutexOption {
	opts := []remutex.MutexOption{remutex.WithLease(cfg.lease)}
	if cfg.maxHold > 0 {
		opts = []remutex.MutexOption{remutex.WithLease(cfg.maxHold), remutex.WithoutRenewal()}
	}
	if cfg.minHold > 0 {
		opts = append(opts, remutex.WithMinHold(cfg.minHold))
	}
	if cfg.fenceEnv != "" {
		opts = append(opts, remutex.WithFencing())
	}
	return opts
}

// check says what is wrong with cfg's flags, or nil; leaseSet reports that
// --lease was given.
func (cfg *runConfig) check(leaseSet bool) error {
	inRange := func(d time.Duration) bool { return d >= remutex.MinLease && d <= remutex.MaxLease }
	switch {
	case !inRange(cfg.lease):
		return fmt.Errorf("--lease %v: must be between 50ms and 24h", cfg.lease)
	case cfg.grace < 0:
		return fmt.Errorf("--grace %v: must not be negative", cfg.grace)
	case cfg.fenceEnv != "" && !validEnvName(cfg.fenceEnv):
		return fmt.Errorf("--fence-env %q is not a variable name", cfg.fenceEnv)
	case cfg.read && cfg.write:
		return errors.New("--read and --write exclude each other (a read/write lock is taken for one or the other)")
	case cfg.minHold != 0 && !inRange(cfg.minHold):
		return fmt.Errorf("--min-hold %v: must be between 50ms and 24h", cfg.minHold)
	case cfg.maxHold != 0 && !inRange(cfg.maxHold):
		return fmt.Errorf("--max-hold %v: must be between 50ms and 24h", cfg.maxHold)
	case cfg.maxHold != 0 && leaseSet:
		return errors.New("--lease and --max-hold exclude each other (--max-hold is a lease that is not renewed)")
	case cfg.maxHold != 0 && cfg.minHold > cfg.maxHold:
		return fmt.Errorf("--min-hold %v exceeds --max-hold %v: the lock is held at most that long", cfg.minHold, cfg.maxHold)
	case cfg.permits > 0 && (cfg.read || cfg.write):
		return errors.New("--permits takes a semaphore, --read and --write a read/write lock: not both")
	case cfg.minHold != 0 && cfg.permits > 0:
		return errors.New("--min-hold is for a mutex, not with --permits")
	case cfg.minHold != 0 && (cfg.read || cfg.write):
		return errors.New("--min-hold is for a mutex, not with --read or --write")
	}
	return nil
}

// runLock is the lock run holds: a DistMutex, a side of a DistRWMutex, or a
// permit of a DistSemaphore.
type runLock interface {
	LockContext(ctx context.Context) error
	TryLockContext(ctx context.Context) (bool, error)
	UnlockContext(ctx context.Context) error
	Lost() <-chan struct{}
	Fence() int64
}

// readLock is the read side of a DistRWMutex as a runLock.
type readLock struct{ *remutex.DistRWMutex }

func (r readLock) LockContext(ctx context.Context) error { return r.RLockContext(ctx) }
func (r readLock) TryLockContext(ctx context.Context) (bool, error) {
	return r.TryRLockContext(ctx)
}
func (r readLock) UnlockContext(ctx context.Context) error { return r.RUnlockContext(ctx) }

// newLock returns the lock cfg asks for.
func (cfg *runConfig) newLock(locks *remutex.Client, opts []remutex.MutexOption) runLock {
	switch {
	case cfg.permits > 0:
		return semLock{locks.NewSemaphore(cfg.name, int64(cfg.permits), opts...)}
	case cfg.read:
		return readLock{locks.NewRWMutex(cfg.name, opts...)}
	case cfg.write:
		return locks.NewRWMutex(cfg.name, opts...)
	}
	return locks.NewMutex(cfg.name, opts...)
}

func (c *cli) run(args []string) int {
	fs := c.flagSet("run")
	cfg := runConfig{lease: remutex.DefaultLease, grace: 5 * time.Second}
	fs.Var((*durationValue)(&cfg.lease), "lease",
		"the lock's lease: how long it outlives remutex if remutex dies, a `duration` from 50ms to 24h")
	fs.Var(&cfg.wait, "wait", "how long to wait for the lock: a `duration`, 0 to try once, or forever (default forever)")
	fs.Var((*durationValue)(&cfg.grace), "grace",
		"how long the command's processes get between SIGTERM and SIGKILL when the lease is lost or they outlive the command: a `duration`")
	fs.StringVar(&cfg.fenceEnv, "fence-env", "REMUTEX_FENCE",
		"environment `variable` that gets the fencing token; empty: no fencing")
	fs.BoolVar(&cfg.read, "read", false, "take the read lock of the read/write lock NAME, which other --read runs share")
	fs.BoolVar(&cfg.write, "write", false, "take the write lock of the read/write lock NAME")
	fs.Var(&cfg.permits, "permits",
		"take one permit of the semaphore NAME of this `number` of permits: at most that many runs at once (every run of NAME gives the same number)")
	fs.Var((*durationValue)(&cfg.minHold), "min-hold",
		"keep the lock taken until this `duration` after it was taken, even if the command is done sooner (scheduled jobs: once per tick); 0: off")
	fs.Var((*durationValue)(&cfg.maxHold), "max-hold",
		"hold the lock at most this `duration`: a lease that is not renewed, in place of --lease; the command is stopped when it runs out; 0: off")
	if code, ok := c.parse(fs, args, func(w io.Writer) {
		fmt.Fprint(w, runUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	}); !ok {
		return code
	}
	if code, ok := c.commandArgs("run", "lock", fs, args, &cfg); !ok {
		return code
	}
	return c.runLocked(cfg)
}

// positional splits NAME [--] COMMAND [ARGS...], the arguments after the
// flags. Where a "--" follows NAME, it must follow it at once: anything
// between them is a mistake (a name of two words, a flag after NAME), not
// a command.
func (cfg *runConfig) positional(args []string) error {
	if len(args) == 0 {
		return errors.New("no lock name")
	}
	cfg.name, args = args[0], args[1:]
	switch i := slices.Index(args, "--"); {
	case len(args) > 0 && args[0] == "--":
		args = args[1:]
	case len(args) > 0 && strings.HasPrefix(args[0], "-"):
		return fmt.Errorf("%s after the lock name: flags go before NAME, and -- before the command", args[0])
	case i > 0:
		return fmt.Errorf("%q between the lock name %q and --: the command goes after --, flags before NAME", strings.Join(args[:i], " "), cfg.name)
	}
	if len(args) == 0 {
		return errors.New("no command")
	}
	cfg.command = args
	return nil
}

// waitBound is how long run may take before its command starts: --wait,
// or TryLock's bound for --wait 0.
func (cfg *runConfig) waitBound() time.Duration {
	if cfg.wait.d == 0 {
		return remutex.TryLockTimeout
	}
	return cfg.wait.d
}

// waitText names waitBound for messages.
func (cfg *runConfig) waitText() string {
	if cfg.wait.d == 0 {
		return fmt.Sprintf("%v (--wait 0)", remutex.TryLockTimeout)
	}
	return fmt.Sprintf("--wait %v", cfg.wait.d)
}

// endedByDashes reports whether "--" ended the flags of args, rest being
// what the flag set left of them.
func endedByDashes(args, rest []string) bool {
	n := len(args) - len(rest)
	return n > 0 && args[n-1] == "--"
}

// validEnvName reports whether s is a portable environment variable name
// (POSIX: letters, digits and '_', not starting with a digit).
func validEnvName(s string) bool {
	for i, r := range s {
		ok := r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9'
		if !ok {
			return false
		}
	}
	return s != ""
}

// runLocked takes the lock, runs the command, and releases the lock.
func (c *cli) runLocked(cfg runConfig) int {
	cmd := exec.Command(cfg.command[0], cfg.command[1:]...)
	if cmd.Err != nil {
		// Not found on PATH: say so before taking the lock.
		c.errorf("%v", cmd.Err)
		return exitNotFound
	}

	// Signals are caught from here on: while waiting they end the wait, while
	// the command runs they are passed on. They are caught even if remutex
	// was started with them ignored (nohup): the command gets them with their
	// default dispositions, as if run directly, and a command that is to
	// survive a hangup ignores SIGHUP itself (remutex run NAME -- nohup ...).
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	// Until the command starts, a signal ends the connection attempt or the
	// wait for the lock.
	ctx, interrupted := watchSignals(sigs)
	if cfg.wait.set {
		// --wait bounds all that comes before the command, connecting too:
		// a Redis that does not answer gets no longer than a busy lock.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.waitBound())
		defer cancel()
	}
	rdb, err := c.connect(ctx)
	if err != nil {
		if sig := interrupted(); sig != nil {
			c.errorf("%v while connecting to Redis", sig)
			return 128 + signalNumber(sig)
		}
		if errors.Is(err, errNoAnswer) {
			c.errorf("%v within %s; the command did not run", err, cfg.waitText())
			return exitRedis
		}
		return c.fail(err)
	}
	defer rdb.Close()
	var seen lastError
	locks := c.lockClient(rdb, remutex.WithErrorHandler(seen.set))
	defer locks.Close() // before rdb.Close: deferred calls run last in, first out
	m := cfg.newLock(locks, cfg.options())

	// Take the lock on this goroutine: holds belong to goroutines, and this
	// one also asks for Lost and Fence and unlocks.
	if code, held := c.acquire(ctx, interrupted, m, locks, cfg, &seen); !held {
		return code
	}
	lost := m.Lost()
	if cfg.fenceEnv != "" {
		cmd.Env = append(os.Environ(), cfg.fenceEnv+"="+strconv.FormatInt(m.Fence(), 10))
	}
	status, lostSeen := c.supervise(cmd, cfg, sigs, lost)
	return c.unlockAfter(m, status, lostSeen)
}

// commandArgs takes sub's (run, once) positional arguments, NAME -- COMMAND
// [ARGS...], into cfg and checks them with its flags: it returns the usage
// error's exit status, or ok.
func (c *cli) commandArgs(sub, what string, fs *flag.FlagSet, args []string, cfg *runConfig) (int, bool) {
	err := cfg.positional(fs.Args())
	if endedByDashes(args, fs.Args()) {
		// sub -- COMMAND: the flag set took the "--", and the command's
		// first word would be taken for NAME.
		err = fmt.Errorf("no %s name before --", what)
	}
	if err != nil {
		return c.usageError("%s: %v (usage: remutex %s [flags] NAME -- COMMAND [ARGS...])", sub, err, sub), false
	}
	leaseSet := false
	fs.Visit(func(f *flag.Flag) { leaseSet = leaseSet || f.Name == "lease" })
	if err := cfg.check(leaseSet); err != nil {
		return c.usageError("%s: %v", sub, err), false
	}
	if err := checkName(cfg.name); err != nil {
		return c.usageError("%s: %v", sub, err), false
	}
	return 0, true
}

// unlockAfter unlocks m once the command is done, and returns remutex's exit
// status: the command's, or exitLost if the lease was lost meanwhile.
func (c *cli) unlockAfter(m runLock, status int, lostSeen bool) int {
	uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	uerr := m.UnlockContext(uctx)
	switch {
	case errors.Is(uerr, remutex.ErrLockLost):
		c.errorf("%v", uerr) // the cause of the loss
		return exitLost
	case lostSeen:
		return exitLost
	case uerr != nil:
		c.errorf("releasing the lock: %v (it ends within its lease)", uerr)
	}
	return status
}

// watchSignals returns a context that ends with the first signal from sigs,
// and a function that stops watching and returns that signal, if one came.
func watchSignals(sigs <-chan os.Signal) (ctx context.Context, interrupted func() os.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		got  os.Signal
		stop = make(chan struct{})
		done = make(chan struct{})
		once sync.Once
	)
	go func() {
		defer close(done)
		select {
		case got = <-sigs:
			cancel()
		case <-stop:
		}
	}()
	return ctx, func() os.Signal {
		once.Do(func() {
			close(stop)
			<-done
			cancel()
		})
		return got
	}
}

// acquire takes m within cfg.wait, or until ctx ends with a signal, which
// stops the watching. It returns held = false with the exit status if it
// did not take the lock: the wait passed, a signal came, or Redis failed.
func (c *cli) acquire(ctx context.Context, interrupted func() os.Signal, m runLock, locks *remutex.Client, cfg runConfig, seen *lastError) (code int, held bool) {
	var err error
	switch {
	case !cfg.wait.set:
		err = m.LockContext(ctx)
	case cfg.wait.d == 0:
		var ok bool
		if ok, err = m.TryLockContext(ctx); err == nil && !ok {
			err = context.DeadlineExceeded
		}
	default:
		err = m.LockContext(ctx) // ctx ends with --wait (see runLocked)
	}
	if sig := interrupted(); sig != nil {
		if err == nil {
			c.release(m)
		}
		c.errorf("%v while waiting for lock %q", sig, cfg.name)
		return 128 + signalNumber(sig), false
	}
	switch {
	case err == nil:
		return 0, true
	case errors.Is(err, context.DeadlineExceeded):
		msg, answered := c.busy(locks, cfg)
		if !answered {
			c.errorf("lock %q: Redis did not answer within %s; the command did not run%s", cfg.name, cfg.waitText(), seen.describe())
			return exitRedis, false
		}
		gaveUp := fmt.Sprintf("gave up after --wait %v", cfg.wait.d)
		if cfg.wait.d == 0 {
			gaveUp = "tried once (--wait 0)"
		}
		c.errorf("%s; %s, the command did not run%s", msg, gaveUp, seen.describe())
		return exitTimeout, false
	}
	if code, ok := c.sizeMismatch(err, cfg); ok {
		return code, false
	}
	c.errorf("%v", err)
	return exitRedis, false
}

// busy says why lock cfg.name was not free, naming its holder if Redis
// answers quickly (the wait is over already); answered is false when Redis
// did not answer in time, which is then the likelier reason.
func (c *cli) busy(locks *remutex.Client, cfg runConfig) (msg string, answered bool) {
	msg = fmt.Sprintf("lock %q is held", cfg.name)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	all, err := readStatus(ctx, locks, cfg.name)
	if err != nil {
		return msg, !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err)
	}
	return c.busyWith(all, cfg, msg), true
}

// isTimeout reports a network timeout (go-redis's "i/o timeout").
func isTimeout(err error) bool {
	var nerr net.Error
	return errors.As(err, &nerr) && nerr.Timeout()
}

// busyWith is busy's message for the status all read.
func (c *cli) busyWith(all lockStatus, cfg runConfig, msg string) string {
	st := all.ofKind(cfg.kind())
	switch {
	case st.Kind == kindSemaphore:
		return semBusy(st)
	case st.state() == stateKept:
		h := st.Holders[0]
		return fmt.Sprintf("lock %q is kept taken by its minimum hold for %s more, after a run by %s",
			cfg.name, describeTTL(h.TTLMillis), h.describe())
	case len(st.Holders) > 0 && st.Kind == kindMutex:
		return msg + " by " + st.Holders[0].describe()
	}
	for _, h := range st.Holders {
		if !h.Read {
			return msg + " for writing by " + h.describe()
		}
	}
	switch {
	case cfg.read && st.WritersWaiting > 0:
		return fmt.Sprintf("lock %q has writers waiting (%d), which go before new readers", cfg.name, st.WritersWaiting)
	case st.Readers > 1:
		return fmt.Sprintf("%s for reading by %s and %d other readers", msg, st.Holders[0].describe(), st.Readers-1)
	case st.Readers == 1:
		return msg + " for reading by " + st.Holders[0].describe()
	}
	return msg
}

// release releases a lock that will not be used.
func (c *cli) release(m runLock) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.UnlockContext(ctx); err != nil {
		c.errorf("releasing the lock: %v (it ends within its lease)", err)
	}
}

// job is the command while it runs.
type job interface {
	// signal passes sig on to the command; on Unix to every process of its
	// process group.
	signal(sig os.Signal)
	// done is closed when the command has exited; on Unix, once every
	// process of its group is gone.
	done() <-chan struct{}
	// finish returns the command's exit status once done is closed.
	finish() int
}

// supervise runs cmd until it exits, passing signals on and stopping it if
// the lease is lost. It returns the command's exit status and whether the
// lease was lost meanwhile.
func (c *cli) supervise(cmd *exec.Cmd, cfg runConfig, sigs <-chan os.Signal, lost <-chan struct{}) (status int, lostSeen bool) {
	// On Linux the supervisor gets its parent-death signal when the thread
	// that started it exits (see setParentDeathSignal): keep this goroutine
	// on that thread for good, so that the thread lives as long as remutex.
	runtime.LockOSThread()
	j, err := startJob(cmd, cfg.grace)
	if err != nil {
		c.errorf("%v", err)
		if errors.Is(err, fs.ErrNotExist) {
			return exitNotFound, false
		}
		return exitCannotRun, false
	}
	var kill <-chan time.Time
	for {
		select {
		case <-j.done():
			return j.finish(), lostSeen
		case s := <-sigs:
			j.signal(s)
		case <-lost:
			lost, lostSeen = nil, true
			why := ""
			if cfg.maxHold > 0 {
				why = fmt.Sprintf(" (--max-hold %v: the lease is not renewed)", cfg.maxHold)
			}
			holding := fmt.Sprintf("lease of lock %q", cfg.name)
			if cfg.holding != "" {
				holding = cfg.holding
			}
			c.errorf("%s lost%s: sending SIGTERM to the command (SIGKILL in %v)", holding, why, cfg.grace)
			j.signal(sigTerm)
			t := time.NewTimer(cfg.grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			c.errorf("the command outlived --grace %v after the lease was lost: sending SIGKILL", cfg.grace)
			j.signal(sigKill)
		}
	}
}

// signalNumber returns a signal's number, for the 128+N exit status.
func signalNumber(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return int(n)
	}
	return 0
}
