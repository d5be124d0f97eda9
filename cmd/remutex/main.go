// Command remutex takes a remutex lock from the shell, in the spirit of
// flock(1) and etcdctl lock, and inspects or clears locks that Go programs
// using the remutex package hold.
//
// Install it with:
//
//	go install github.com/remutex/remutex/cmd/remutex@latest
//
// Usage:
//
//	remutex run [--lease D | --max-hold D] [--min-hold D] [--wait D] [--grace D] [--fence-env NAME] [--read | --write | --permits N] NAME -- COMMAND [ARGS...]
//	remutex once [--lease D] [--wait D] [--grace D] [--fence-env NAME] NAME -- COMMAND [ARGS...]
//	remutex elect [--lease D] [--grace D] [--fence-env NAME] [--again] NAME --value VALUE -- COMMAND [ARGS...]
//	remutex leader [--watch] [--json] NAME
//	remutex status [--json] NAME...
//	remutex unlock --force [--yes] [--owner OWNER]... NAME
//	remutex help [COMMAND]
//	remutex --version
//
// run takes the lock NAME, waiting for it up to --wait (default: as long as
// it takes; 0 tries once), and runs COMMAND while the lease (--lease, default
// 30s) is renewed in the background. The command gets the lock's fencing
// token in the environment variable named by --fence-env (default
// REMUTEX_FENCE; an empty name turns fencing off). When the command exits,
// the lock is released and remutex exits with the command's status.
//
// The lock is a mutex, as remutex.DistMutex is: one run holds it at a time.
// With --read or --write (not both), run takes instead the read or the write
// lock of the read/write lock NAME, as remutex.DistRWMutex does (a separate
// lock from the mutex of the same name): any number of --read runs hold it
// at once, or one --write run, and a reader that comes while a writer waits
// queues behind the writer. A --read run gets the token of the latest write
// (0 before any).
//
// With --permits N, run takes instead one permit of the semaphore NAME of N
// permits, as remutex.DistSemaphore does (a lock of its own again): at most
// N runs of it run their commands at once, across machines, and the others
// queue, first come first served, with the same process-group guarantees
// as a mutex's run (below). Every run of the semaphore must give the same N:
// the size is kept in Redis, and a run with another N is refused (status
// 64). Each run gets the fencing token of its own acquisition. --permits
// goes with --lease or --max-hold, --wait, --grace and --fence-env, not
// with --read, --write or --min-hold (a mutex's).
//
// Scheduled jobs: the same cron line on several machines, whose clocks and
// schedulers differ, runs its job once per tick with
//
//	remutex run --wait 0 --min-hold 30s --max-hold 10m nightly-report -- ./report.sh
//
// --min-hold D (remutex.WithMinHold, a mutex's option: not with --read or
// --write) keeps the lock taken until D after it was taken, even if the
// command was done sooner, so that the runners that come later in the same
// tick find it taken and, with --wait 0, skip it (exit status 75). Choose D
// longer than the skew between the machines and shorter than the tick.
// --max-hold D (remutex.WithLease and WithoutRenewal) makes the lease D and
// fixed instead of renewed, in place of --lease: a runner that dies frees the
// job after D at most, and a command still running when the lease runs out
// is stopped as after any lost lease (below), since if it ran on unlocked the
// next run could start beside it. --min-hold must not exceed --max-hold. By
// default neither is set: the lock is free when the command exits, and the
// lease is renewed for as long as it runs.
//
// The command runs in a process group of its own, watched by a supervisor (a
// second remutex process), so that no process of the command outlives the
// lock:
//
//   - SIGINT, SIGTERM and SIGHUP sent to remutex are passed on to the whole
//     group, also when remutex was started with them ignored (nohup): the
//     command gets default signal dispositions.
//   - If the lease is lost (Redis unreachable for longer than the lease, the
//     key deleted, the fixed lease of --max-hold run out), the group gets
//     SIGTERM, then SIGKILL after --grace (default 5s), and remutex exits
//     with status 79.
//   - Processes the command leaves running when it exits get SIGTERM, then
//     SIGKILL after --grace; the lock is released only once they are gone.
//   - If remutex dies, even of SIGKILL, the supervisor kills the group at once.
//
// This holds on Linux, where the supervisor also has a parent-death signal;
// elsewhere it is best effort. A process that leaves the group on purpose
// (setsid, setpgid) escapes it.
//
// When standard input is a terminal, the command's group is made the
// terminal's foreground group while it runs, so that it can read the terminal
// and Ctrl-C reaches it once; stopping it with Ctrl-Z is not supported.
//
// once runs COMMAND once across every caller of NAME (remutex.DistOnce):
// the first caller anywhere runs it as run would (process group, renewed
// lease, fencing token); the others wait for that run (--wait bounds the
// wait) and exit 0 if it succeeded, 80 if it failed (they do not run it;
// the next once of NAME does); after a success every once of NAME exits 0
// without running anything. The runner exits with the command's status.
//
// elect campaigns in the election NAME (remutex.DistElection) with the
// value --value and runs COMMAND while this process leads, as run would
// (process group, signals passed on, lease renewed), with the term's number
// in REMUTEX_TERM and in --fence-env's variable; when the command exits it
// resigns, and the next candidate leads. If the term is lost, the command
// is stopped as after a lost lease (status 79). With --again it campaigns
// again after each term, until interrupted.
//
// leader prints the leader of the election NAME in one line, "TERM SINCE
// HOST PID VALUE" (--json: a JSON object), or exits 1 if nobody leads;
// --watch prints a line for each change of leader or value until
// interrupted.
//
// status prints, for each lock, of each kind under its name (mutex,
// rwmutex, semaphore), its state (free, held, kept, write, read ×N, and for
// a semaphore of S permits held H/S or free 0/S; kept: a mutex that nobody
// holds but its minimum hold keeps taken, for the time its TTL shows), each
// hold's owner token with the host and pid of the holding process, its mode
// (read or write, for a read/write lock), hold count (a semaphore holder's
// permits) and remaining lease, the last fencing token handed out, the
// waiters queued in Redis and how many of them wait to write, and the number
// of Clients listening for the lock's messages; then the waiters, each with
// its owner token, host, pid, what it waits for (a semaphore's waiter: how
// many permits) and for how long. --json prints the same as a JSON array
// for scripts. It reads the lock with remutex's Client.Inspect.
//
// unlock --force releases a stuck lock (a holder that is frozen, not dead: a
// dead holder's lock ends by itself within its lease) as the holders' own
// unlocks would, whatever its kind: a mutex's hold, a read/write lock's write
// hold and read holds, a semaphore's holders with all their permits; with
// --owner, only the holds of the owner tokens given. Its waiters are woken
// or handed the lock as after those unlocks (remutex's Client.ForceUnlock).
// It asks for confirmation on standard input unless --yes is given, it
// releases only the holds it showed (nothing if the lock changed hands since
// it was read), and it names those that had ended meanwhile. Each holder, if
// it resumes, finds its lease lost. It also frees a mutex kept by its
// minimum hold.
//
// # Connection
//
// Every command takes these flags, before or after the command name:
//
//	--addr HOST:PORT   a Redis server (default: $REDIS_ADDR, else 127.0.0.1:6379)
//	--url URL          a redis:// or rediss:// URL, with user and password (default: $REDIS_URL)
//	--cluster ADDRS    comma-separated addresses of a Redis Cluster, or a cluster URL
//	--prefix P         the key prefix of the locks (default "remutex:")
//
// At most one of --addr, --url and --cluster may be given; without any,
// REDIS_URL is used if set, then REDIS_ADDR.
//
// # Exit status
//
//	0-255  run, elect: the command's own status; 128+N if a signal N killed it
//	       (elect: or ended the campaign, before the command ran)
//	0      status, unlock: done (unlock: also when the lock was already free); once: done;
//	       leader: a leader was printed (--watch: interrupted)
//	1      unlock: not confirmed, or the lock changed hands meanwhile; leader: nobody leads
//	64     usage error; run: also a --permits that is not the semaphore's size
//	69     Redis error: unreachable, a failed command, a key of another type
//	75     run: --wait passed and the lock was still held; the command did not run
//	       (once: --wait passed before the run ended)
//	79     run: the lease was lost while the command ran (or --max-hold passed);
//	       elect: the term was lost while the command ran (not with --again)
//	80     once: the run this caller waited for (another's) failed; the next once runs it again
//	126    run, elect: COMMAND could not be executed
//	127    run, elect: COMMAND was not found
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Exit statuses. 64, 69 and 75 are sysexits.h's EX_USAGE, EX_UNAVAILABLE and
// EX_TEMPFAIL; 126 and 127 are the shell's.
const (
	exitOK        = 0
	exitDeclined  = 1
	exitUsage     = 64
	exitRedis     = 69
	exitTimeout   = 75
	exitLost      = 79
	exitCannotRun = 126
	exitNotFound  = 127
)

const usageText = `remutex: a distributed lock on Redis for scripts and cron jobs

Usage:
  remutex run [--lease D | --max-hold D] [--min-hold D] [--wait D] [--grace D] [--fence-env NAME] [--read | --write | --permits N] NAME -- COMMAND [ARGS...]
  remutex once [--lease D] [--wait D] [--grace D] [--fence-env NAME] NAME -- COMMAND [ARGS...]
  remutex elect [--lease D] [--grace D] [--fence-env NAME] [--again] NAME --value VALUE -- COMMAND [ARGS...]
  remutex leader [--watch] [--json] NAME
  remutex status [--json] NAME...
  remutex unlock --force [--yes] [--owner OWNER]... NAME
  remutex help [COMMAND]
  remutex --version

Commands:
  run     take lock NAME (waiting up to --wait), run COMMAND while the lease is
          renewed, release the lock when it exits, and exit with its status;
          --read or --write take the read/write lock NAME for reading or
          writing; --permits N takes one permit of the semaphore NAME of N
          permits (at most N runs at once); --min-hold and --max-hold bound
          the hold from below and above, for a scheduled job that is to run
          once per tick
  once    run COMMAND once across every caller of NAME: the first runs it,
          the others wait for that run and exit with its outcome, and once
          it succeeded every caller exits 0 at once (a database migration
          run by one of many pods)
  elect   campaign in election NAME with VALUE and run COMMAND while this
          process leads (stopped if the term is lost); the term's number is
          in $REMUTEX_TERM; --again campaigns again after each term
  leader  print the leader of election NAME (TERM SINCE HOST PID VALUE, or
          --json); --watch prints a line for each change
  status  show each lock's kind and state (free, held, kept, write, read ×N,
          held H/S permits), its holders (owner, mode, host, pid), hold
          counts or permits, remaining leases, last fencing token, queued
          waiters (who, waiting for what and how long), waiting writers and
          subscribed Clients
  unlock  release a stuck lock's holds (read and write holds, a semaphore's
          permits; --owner: only those of one holder) and wake its next
          waiters (asks first unless --yes)

Run "remutex help COMMAND" for a command's flags and details, and
"remutex --version" for the version.

Connection flags (any command, before or after its name):
  --addr HOST:PORT   a Redis server (default: $REDIS_ADDR, else 127.0.0.1:6379)
  --url URL          a redis:// or rediss:// URL with user and password (default: $REDIS_URL)
  --cluster ADDRS    comma-separated addresses of a Redis Cluster, or a cluster URL
  --prefix P         key prefix of the locks (default "remutex:")

Exit status:
  0-255  run, elect: the command's own status; 128+N if a signal N killed it
         (elect: or ended the campaign, before the command ran)
  0      status, unlock: done (unlock: also when the lock was already free);
         once: done (by this run, another, or before); leader: printed
         (--watch: interrupted)
  1      unlock: not confirmed, or the lock changed hands meanwhile;
         leader: nobody leads
  64     usage error; run: also a --permits that is not the semaphore's size
  69     Redis error: unreachable, a failed command, a key of another type
  75     run: --wait passed while the lock was held; the command did not run
         (once: --wait passed before the run ended; nothing ran here)
  79     run: the lease was lost while the command ran, or --max-hold passed
         (its process group was sent SIGTERM, then SIGKILL after --grace);
         elect: the term was lost while the command ran (not with --again)
  80     once: the run this caller waited for (another's) failed; the
         command did not run here, and the next once runs it again
  126    run, elect: COMMAND could not be executed
  127    run, elect: COMMAND was not found
`

// cli is one invocation: its arguments, environment and standard streams.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	conn           connFlags
}

func main() {
	if code, ok := supervisorMain(); ok {
		os.Exit(code)
	}
	// go-redis logs dial failures on its own; remutex reports them once.
	redis.SetLogger(quietLogger{})
	c := &cli{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	os.Exit(c.main(os.Args[1:]))
}

// main runs the command line args and returns the exit status.
func (c *cli) main(args []string) int {
	global := c.flagSet("remutex")
	showVersion := global.Bool("version", false, "print the version")
	if code, ok := c.parse(global, args, func(w io.Writer) { fmt.Fprint(w, usageText) }); !ok {
		return code
	}
	if *showVersion {
		fmt.Fprintln(c.stdout, "remutex", version())
		return exitOK
	}
	args = global.Args()
	if len(args) == 0 {
		fmt.Fprint(c.stderr, usageText)
		return exitUsage
	}
	if args[0] == "help" {
		switch len(args) {
		case 1:
			fmt.Fprint(c.stdout, usageText)
			return exitOK
		case 2:
			// "help run" is "run -h": the command prints its own usage.
			return c.command(args[1], []string{"-h"})
		}
		return c.usageError("help: want at most one command name (usage: remutex help [COMMAND])")
	}
	return c.command(args[0], args[1:])
}

// command runs the command name with its arguments.
func (c *cli) command(name string, args []string) int {
	switch name {
	case "run":
		return c.run(args)
	case "status":
		return c.status(args)
	case "unlock":
		return c.unlock(args)
	case "once":
		return c.once(args)
	case "elect":
		return c.elect(args)
	case "leader":
		return c.leader(args)
	}
	return c.usageError("unknown command %q (want run, once, elect, leader, status or unlock; see \"remutex help\")", name)
}

// version is the module version remutex was built from: "(devel)" for a
// build whose version is unknown.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// flagSet returns a flag set for a command, with the connection flags.
func (c *cli) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package's own messages (usage after every error) are not
	// shown: parse prints usage for -h and one line for an error.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	c.conn.register(fs)
	return fs
}

// parse parses args into fs. It returns ok = false with the exit status when
// the command is done: usage printed to stdout for -h (status 0), or one line
// on stderr for a bad flag (status 64).
func (c *cli) parse(fs *flag.FlagSet, args []string, usage func(io.Writer)) (code int, ok bool) {
	err := fs.Parse(args)
	return c.parsed(fs, err, usage)
}

// parseNames is parse for commands whose positional arguments are all lock
// names: flags may also follow them, up to a "--". It returns the names.
func (c *cli) parseNames(fs *flag.FlagSet, args []string, usage func(io.Writer)) (names []string, code int, ok bool) {
	for {
		err := fs.Parse(args)
		if err != nil {
			code, ok := c.parsed(fs, err, usage)
			return nil, code, ok
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			names = append(names, rest...)
			break
		}
		names, args = append(names, rest[0]), rest[1:]
	}
	code, ok = c.parsed(fs, nil, usage)
	return names, code, ok
}

// parsed finishes parse after fs.Parse returned err.
func (c *cli) parsed(fs *flag.FlagSet, err error, usage func(io.Writer)) (code int, ok bool) {
	switch {
	case err == nil:
		if err := c.conn.check(); err != nil {
			return c.usageError("%v", err), false
		}
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		usage(c.stdout)
		return exitOK, false
	}
	return c.usageError("%s", flagError(fs.Name(), err)), false
}

// flagError is a bad flag of command name, with where to read about flags.
func flagError(name string, err error) string {
	msg := twoDashes(err.Error())
	if name == "remutex" {
		return fmt.Sprintf("%s (see \"remutex help\")", msg)
	}
	return fmt.Sprintf("%s: %s (see \"remutex help %s\")", name, msg, name)
}

// flagNamed matches where the flag package's errors name a flag, with one
// dash ("flag provided but not defined: -x", "flag needs an argument: -x",
// `invalid value "v" for flag -x: ...`, `invalid boolean value "v" for
// -x: ...`).
var flagNamed = regexp.MustCompile(`^(flag provided but not defined: |flag needs an argument: |invalid value "(?:[^"\\]|\\.)*" for flag |invalid boolean value "(?:[^"\\]|\\.)*" for )-([^-])`)

// twoDashes rewrites a flag package error to name the flag with two dashes,
// as the documentation and users write flags (either form is accepted).
func twoDashes(msg string) string {
	return flagNamed.ReplaceAllString(msg, "${1}--${2}")
}

// errorf prints a message prefixed "remutex: " to stderr.
func (c *cli) errorf(format string, args ...interface{}) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(c.stderr, "remutex: "+strings.TrimPrefix(msg, "remutex: "))
}

// usageError prints a usage message and returns exitUsage.
func (c *cli) usageError(format string, args ...interface{}) int {
	c.errorf(format, args...)
	return exitUsage
}

// quietLogger discards go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...interface{}) {}
