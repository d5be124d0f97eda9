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
// The replicas print what they do as JSON lines, which the parent reads,
// prints and checks: the terms (from the moment a replica starts leading
// until it stops or is killed) must not overlap, and the register must
// never have seen a term go back.
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
// in overlapping terms, if the register refused a write (a term went back),
// or if a replica failed.
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
	"sort"
	"strconv"
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
	defer func() {
		bg := context.WithoutCancel(ctx)
		elect := remutex.DefaultKeyPrefix + "{" + s.Election + "}:elect"
		admin.Del(bg, elect, elect+":fence", elect+":waiting", elect+":leader", elect+":log")
		admin.Del(bg, s.Register, s.Writes)
	}()

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
	for sh.running > 0 {
		select {
		case a := <-reps.arrivals:
			if err := sh.take(a); err != nil {
				return false, err
			}
		case <-ctx.Done():
			return false, fmt.Errorf("%d replicas still running: %w", sh.running, context.Cause(ctx))
		}
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

// span is a term as its leader lived it: from the moment it started leading
// until it stopped, or was killed.
type span struct {
	term       int64
	id         int
	start, end time.Time
	ended      bool   // it said it stopped leading
	stoppedBy  string // "SIGKILL" (then end is the kill) or "SIGTERM"; "" if not stopped by the parent
}

// over reports whether the term is over, and end known.
func (sp *span) over() bool { return sp.ended || sp.stoppedBy == "SIGKILL" }

// handOver is the time from the end of a term that the parent stopped to
// the start of the next.
type handOver struct {
	how  string // "SIGKILL" or "Resign"
	took time.Duration
}

// handOverTo returns the hand-over from prev to next, if prev was stopped
// by the parent and is over.
func handOverTo(prev, next *span) (handOver, bool) {
	switch {
	case prev == nil || prev.stoppedBy == "" || !prev.over():
		return handOver{}, false
	case prev.stoppedBy == "SIGKILL":
		return handOver{how: "SIGKILL", took: next.start.Sub(prev.end)}, true
	}
	return handOver{how: "Resign", took: next.start.Sub(prev.end)}, true
}

// show prints the replicas' notes as they arrive, stops each leader once it
// has run its job -jobs times (the first with SIGKILL, the others with
// SIGTERM), and keeps what the verdict needs.
type show struct {
	out     io.Writer
	cfg     config
	reps    *replicas
	running int

	terms   map[int64]*span
	last    *span              // the latest term
	leading *span              // the term whose jobs are counted, nil while none
	jobs    int                // its runs of the job that the register took
	stopped map[int]string     // replica -> the signal that stopped it
	pending map[int64][]string // followers' lines about a term whose leader has not said it leads yet
}

func newShow(out io.Writer, cfg config, reps *replicas) *show {
	return &show{
		out: out, cfg: cfg, reps: reps, running: len(reps.procs),
		terms: map[int64]*span{}, stopped: map[int]string{}, pending: map[int64][]string{},
	}
}

func (sh *show) line(who, format string, args ...interface{}) {
	fmt.Fprintf(sh.out, "%-11s %s\n", who, fmt.Sprintf(format, args...))
}

// take handles one arrival. It returns an error if a replica failed.
func (sh *show) take(a arrival) error {
	name := "replica-" + strconv.Itoa(a.id)
	if a.exited {
		sh.running--
		how, stopped := sh.stopped[a.id]
		switch {
		case !stopped:
			return fmt.Errorf("%s ended by itself: %v", name, a.err)
		case how == "SIGTERM" && a.err != nil:
			return fmt.Errorf("%s, stopped with SIGTERM: %v", name, a.err)
		}
		return nil
	}
	n := a.note
	at := time.Unix(0, n.At)
	switch n.Kind {
	case "campaigns":
		sh.line(name, "campaigns (pid %d)", n.PID)
	case "leads":
		sp := &span{term: n.Term, id: a.id, start: at}
		since := ""
		if h, ok := handOverTo(sh.last, sp); ok {
			since = ", " + sh.describe(h, sh.last.id)
		}
		sh.terms[n.Term], sh.last = sp, sp
		sh.leading, sh.jobs = sp, 0
		sh.line(name, "leads: term %d%s", n.Term, since)
		for _, l := range sh.pending[n.Term] {
			fmt.Fprint(sh.out, l)
		}
		delete(sh.pending, n.Term)
	case "sees":
		l := fmt.Sprintf("%-11s sees %s lead: term %d (pid %d)\n", name, n.Who, n.Term, n.PID)
		if sh.terms[n.Term] == nil {
			sh.pending[n.Term] = append(sh.pending[n.Term], l)
			return nil
		}
		fmt.Fprint(sh.out, l)
	case "job":
		if !n.OK {
			sh.line(name, "job %d: the register REFUSED term %d: a later term wrote before it", n.N, n.Term)
			return fmt.Errorf("%s leads term %d, which the register refused: two leaders at once", name, n.Term)
		}
		sh.line(name, "job %d: the register took term %d", n.N, n.Term)
		if sp := sh.leading; sp != nil && sp.term == n.Term {
			if sh.jobs++; sh.jobs == sh.cfg.jobs {
				return sh.stop(sp)
			}
		}
	case "stops":
		sp := sh.terms[n.Term]
		if sp == nil {
			return fmt.Errorf("%s stops term %d, which it never said it led", name, n.Term)
		}
		sp.end, sp.ended = at, true
		sh.line(name, "stops leading term %d: %s", n.Term, n.Why)
		if sh.leading == sp {
			sh.leading = nil
		}
	default:
		return fmt.Errorf("%s: unexpected output %q", name, n.Why)
	}
	return nil
}

// stop stops the leader of sp: the first with SIGKILL, the others with
// SIGTERM.
func (sh *show) stop(sp *span) error {
	name := "replica-" + strconv.Itoa(sp.id)
	p := sh.reps.procs[sp.id-1]
	sh.leading = nil
	if len(sh.stopped) == 0 {
		sh.stopped[sp.id], sp.stoppedBy = "SIGKILL", "SIGKILL"
		if err := p.cmd.Process.Kill(); err != nil {
			return fmt.Errorf("killing %s: %w", name, err)
		}
		sp.end = time.Now() // it can act no more
		sh.line("--", "SIGKILL to %s (pid %d): it resigns nothing; its term ends when its lease, renewed every third of a lease, runs out",
			name, p.cmd.Process.Pid)
		return nil
	}
	sh.stopped[sp.id], sp.stoppedBy = "SIGTERM", "SIGTERM"
	sh.line("--", "SIGTERM to %s (pid %d), as a rolling deploy does: Run's context ends, and it resigns", name, p.cmd.Process.Pid)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	return nil
}

// describe renders a hand-over from replica prev: in leases after a
// SIGKILL.
func (sh *show) describe(h handOver, prev int) string {
	if h.how == "SIGKILL" {
		return fmt.Sprintf("%.2f leases (%v) after the SIGKILL", leases(h.took, sh.cfg.lease), h.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%v after replica-%d stopped and resigned", h.took.Round(10*time.Microsecond), prev)
}

func leases(d, lease time.Duration) float64 { return float64(d) / float64(lease) }

// report prints the terms, the register's writes and the verdict, and
// reports whether the run was sound.
func (sh *show) report(ws []write) bool {
	spans := make([]*span, 0, len(sh.terms))
	for _, sp := range sh.terms {
		spans = append(spans, sp)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].term < spans[j].term })
	var led []string
	for _, sp := range spans {
		s := fmt.Sprintf("replica-%d", sp.id)
		if sp.stoppedBy == "SIGKILL" {
			s += " (killed)"
		}
		led = append(led, s)
	}
	fmt.Fprintf(sh.out, "terms:      %d, led in turn by %s\n", len(spans), strings.Join(led, ", "))
	fmt.Fprintf(sh.out, "register:   %s\n", describeWrites(ws))
	v := verdict(spans, ws, sh.cfg.lease)
	fmt.Fprintf(sh.out, "verdict:    %s\n", v)
	return strings.HasPrefix(v, "ok: ")
}

// write is one entry of the register's log.
type write struct {
	term  int64
	id, n int
	ok    bool
}

// parseWrites reads the register's log.
func parseWrites(log []string) ([]write, error) {
	ws := make([]write, len(log))
	for k, e := range log {
		var status string
		if _, err := fmt.Sscan(e, &ws[k].term, &ws[k].id, &ws[k].n, &status); err != nil {
			return nil, fmt.Errorf("the register's write %d reads %q: %w", k+1, e, err)
		}
		ws[k].ok = status == "ok"
	}
	return ws, nil
}

// describeWrites renders the register's log.
func describeWrites(ws []write) string {
	terms, refused := map[int64]bool{}, 0
	for _, w := range ws {
		terms[w.term] = true
		if !w.ok {
			refused++
		}
	}
	return fmt.Sprintf("%d writes by %d terms, %d refused", len(ws), len(terms), refused)
}

// verdict judges a run: the terms, in the order of their numbers, must
// each have ended before the next began; the register, in the order of its
// writes, must never have seen a term lower than one it took; and the
// first hand-over is the SIGKILL's.
func verdict(spans []*span, ws []write, lease time.Duration) string {
	var hands []handOver
	for i, sp := range spans {
		if !sp.over() {
			return fmt.Sprintf("FAIL: term %d of replica-%d never ended", sp.term, sp.id)
		}
		if i == 0 {
			continue
		}
		prev := spans[i-1]
		if !prev.end.Before(sp.start) {
			return fmt.Sprintf("FAIL: two leaders at once: replica-%d led term %d until %s, replica-%d led term %d from %s",
				prev.id, prev.term, prev.end.Format("15:04:05.000000"), sp.id, sp.term, sp.start.Format("15:04:05.000000"))
		}
		if h, ok := handOverTo(prev, sp); ok {
			hands = append(hands, h)
		}
	}
	var last int64
	for k, w := range ws {
		if w.term < last || !w.ok {
			return fmt.Sprintf("FAIL: a term went back at the register: its write %d, by replica-%d, has term %d after term %d",
				k+1, w.id, w.term, last)
		}
		last = w.term
	}
	if len(hands) == 0 || hands[0].how != "SIGKILL" {
		return "FAIL: nobody led after the SIGKILL"
	}
	s := fmt.Sprintf("ok: one leader at a time, the register saw the terms only rise; the next leader led %.2f leases after the SIGKILL",
		leases(hands[0].took, lease))
	var resign []string
	for _, h := range hands[1:] {
		resign = append(resign, h.took.Round(10*time.Microsecond).String())
	}
	if len(resign) > 0 {
		s += ", " + strings.Join(resign, ", ") + " after a Resign"
	}
	return s
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
