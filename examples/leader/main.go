// Command leader runs three replicas of a small service that elect a leader
// with a remutex.DistElection, kills the leader, and shows the hand-over.
//
// Each replica is a process: the program starts itself -replicas times, and
// each child is one remutex Client on its own connection pool, all on one
// Redis. Every replica calls DistElection.Run with its name as its value:
// it campaigns, and while it leads it runs a scheduled job every -every: a
// write to a register in Redis fenced by the term (a script that refuses a
// term lower than the last one it took), as a leader writing to storage
// would. Through OnNewLeader (Observe) every replica hears who leads; the
// followers print it.
//
// Once the leader has run its job -jobs times, the parent kills it with
// SIGKILL: it stops at once and resigns nothing, so its term ends in Redis
// only when its lease (-lease) does; then the next candidate leads. The time
// this took is printed in leases. Each next leader is stopped with SIGTERM,
// as a rolling deploy does: Run's context ends, the job returns, Run
// resigns, and the next candidate leads at once.
//
// The replicas print what they do as JSON lines, which the parent reads
// and prints. At the end it checks the register's log, in which each write
// has the Redis server's time: no leader may have written once a later
// term had begun (its Leader.Since, on the same clock), and the register
// must never have seen a term go back.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server;
// the miniredis runs in the parent, and the replicas connect to it on
// loopback.
//
//	go run ./examples/leader
//	go run ./examples/leader -replicas 5 -lease 2s
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/leader
//
// Its last line is a verdict; it exits with status 1 if two leaders acted
// in overlapping terms (a write with a term after a later term began), if
// the register refused a write (a term went back), or if a replica failed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run of the example.
type config struct {
	replicas int           // replica processes, one Client each
	lease    time.Duration // the election's lease: how long a killed leader's term outlives it
	every    time.Duration // the job's period
	jobs     int           // job runs of each leader before it is stopped
}

func main() {
	if js := os.Getenv(replicaEnv); js != "" {
		os.Exit(replicaMain(js)) // a replica started by the parent
	}
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs the example with the command-line arguments args, on REDIS_ADDR
// if set, and returns the exit status.
func cli(args []string, out, errOut io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.IntVar(&cfg.replicas, "replicas", 3, "replica processes, each with its own remutex Client")
	fs.DurationVar(&cfg.lease, "lease", time.Second, "the election's lease: how long a killed leader's term outlives it")
	fs.DurationVar(&cfg.every, "every", 200*time.Millisecond, "the leader's job runs this often")
	fs.IntVar(&cfg.jobs, "jobs", 3, "job runs of each leader before it is stopped")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.replicas < 2 || cfg.lease < remutex.MinLease || cfg.lease > remutex.MaxLease || cfg.every <= 0 || cfg.jobs < 1 {
		fmt.Fprintf(errOut, "leader: need -replicas ≥ 2, %v ≤ -lease ≤ %v, -every > 0 and -jobs ≥ 1\n", remutex.MinLease, remutex.MaxLease)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, out, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(errOut, "leader:", err)
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// run runs the replicas on the Redis at addr (an embedded miniredis if
// empty) until each of them has led and been stopped, prints what happens
// to out, and reports whether the terms were sound.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (bool, error) {
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return false, err
		}
		defer mr.Close()
		stopClock := realTimeClock(mr)
		defer stopClock()
		addr, where = mr.Addr(), "embedded miniredis in this process, its clock advanced in real time so that leases end; "+
			"the replicas connect on loopback (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "leader:     %d replicas (processes, one Client each) elect a leader; lease %v; the leader's job runs every %v\n",
		cfg.replicas, cfg.lease, cfg.every)
	fmt.Fprintf(out, "redis:      %s\n", where)

	s := newSpec(cfg)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	defer dropKeys(context.WithoutCancel(ctx), admin, s)

	// Each leader leads for about -jobs runs of the job, and the first
	// hand-over waits for a lease; a run that takes far longer is stuck.
	ctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(cfg.replicas)*(2*cfg.lease+time.Duration(cfg.jobs)*cfg.every))
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	reps, err := startReplicas(exe, addr, s, cfg.replicas)
	if err != nil {
		return false, err
	}
	defer reps.stop()

	sh := newShow(out, cfg, reps)
	if err := sh.follow(ctx); err != nil {
		return false, err
	}
	log, err := admin.LRange(ctx, s.Writes, 0, -1).Result()
	if err != nil {
		return false, err
	}
	ws, err := parseWrites(log)
	if err != nil {
		return false, err
	}
	return sh.report(ws), nil
}

// dropKeys deletes the keys of the run's election and register.
func dropKeys(ctx context.Context, admin *redis.Client, s spec) {
	elect := remutex.DefaultKeyPrefix + "{" + s.Election + "}:elect"
	admin.Del(ctx, elect, elect+":fence", elect+":waiting", elect+":leader", elect+":log")
	admin.Del(ctx, s.Register, s.Writes)
}

// newSpec returns the replicas' spec for a run of its own: its election and
// register have a random name.
func newSpec(cfg config) spec {
	var id [6]byte
	_, _ = rand.Read(id[:])
	name := "leader:" + hex.EncodeToString(id[:])
	return spec{
		Election: name, Register: "{" + name + "}:register", Writes: "{" + name + "}:writes",
		Lease: cfg.lease, Every: cfg.every,
	}
}

// replicas are the child processes, and the notes they send.
type replicas struct {
	procs    []*proc
	arrivals chan arrival
	quit     chan struct{} // closed by stop: the readers stop sending
	wg       sync.WaitGroup
}

// proc is one replica process.
type proc struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser // closing it tells the replica that the parent is gone
	stderr bytes.Buffer   // read after the process ended
	exited chan struct{}  // closed once the process has ended
}

// arrival is a note from replica id, or the end of its process.
type arrival struct {
	id     int
	note   note
	exited bool
	err    error // exited: how
}

// startReplicas starts n replicas: this program again, with the spec in
// replicaEnv, on the Redis at addr. A goroutine per replica reads its
// notes; stop ends them all.
func startReplicas(exe, addr string, s spec, n int) (*replicas, error) {
	r := &replicas{arrivals: make(chan arrival), quit: make(chan struct{})}
	for id := 1; id <= n; id++ {
		s.ID = id
		js, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		p := &proc{id: id, cmd: exec.Command(exe), exited: make(chan struct{})}
		p.cmd.Env = append(os.Environ(), replicaEnv+"="+string(js), "REDIS_ADDR="+addr)
		p.cmd.Stderr = &p.stderr
		stdout, err := p.cmd.StdoutPipe()
		if err == nil {
			p.stdin, err = p.cmd.StdinPipe()
		}
		if err == nil {
			err = p.cmd.Start()
		}
		if err != nil {
			r.stop()
			return nil, fmt.Errorf("starting replica-%d: %w", id, err)
		}
		r.procs = append(r.procs, p)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.read(p, stdout)
		}()
	}
	return r, nil
}

// read sends p's notes, then the end of p, as arrivals until r stops.
func (r *replicas) read(p *proc, stdout io.Reader) {
	send := func(a arrival) bool {
		select {
		case r.arrivals <- a:
			return true
		case <-r.quit:
			return false
		}
	}
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var n note
		if err := json.Unmarshal(sc.Bytes(), &n); err != nil {
			n = note{Kind: "garbled", Why: sc.Text()}
		}
		if !send(arrival{id: p.id, note: n}) {
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout) // Wait may close the pipe once it is read to its end
	err := p.cmd.Wait()
	close(p.exited)
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	send(arrival{id: p.id, exited: true, err: err})
}

// stop kills the replicas still running and waits for their readers.
func (r *replicas) stop() {
	close(r.quit)
	for _, p := range r.procs {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
		}
		_ = p.stdin.Close()
	}
	r.wg.Wait()
}

// realTimeClock advances mr's clock with the wall clock, every 5ms, until
// stop is called: miniredis expires keys only when told that time passed.
func realTimeClock(mr *miniredis.Miniredis) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case now := <-t.C:
				mr.FastForward(now.Sub(last))
				last = now
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-stopped }
}
