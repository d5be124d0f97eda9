package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// jsonOf returns every number of r, and the targets as the report shows them.
func jsonOf(r *results) []byte {
	b, err := json.MarshalIndent(struct {
		*results
		Targets []target
	}{r, r.targets()}, "", "  ")
	if err != nil {
		return []byte(fmt.Sprintf("{\"error\": %q}\n", err.Error()))
	}
	return append(b, '\n')
}

// markdown renders the report: the machine, the floor, the targets and one
// table per scenario.
func markdown(r *results) string {
	w := &page{}
	w.header(r)
	w.machine(r)
	w.floor(r)
	w.targets(r)
	w.instructions(r)
	w.uncontended(r)
	w.contended(r)
	w.held(r)
	w.scale(r)
	w.nested(r)
	w.rw(r)
	w.hooks(r)
	w.semaphore(r)
	w.handoff(r)
	w.configurations(r)
	return w.String()
}

// page is a report being written.
type page struct{ strings.Builder }

func (w *page) p(format string, args ...any) { fmt.Fprintf(w, format, args...) }

func (w *page) header(r *results) {
	mode := "full run"
	cmd := "go run . -out results"
	if r.Plan.Short {
		mode = "short run (-short): few samples, indicative only"
		cmd = "go run . -short -out <dir>"
	}
	if r.Instructions != nil {
		cmd = strings.Replace(cmd, " -out", " -instructions -out", 1)
	}
	w.p("# remutex and other Go Redis locks\n\n")
	w.p("Measured %s in one run (%s, %s). Reproduce from `benchmarks/`: `%s`.\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), mode, r.Took.Round(time.Second), cmd)
}

func (w *page) machine(r *results) {
	w.p("## Machine\n\n| | |\n|---|---|\n")
	m := r.Machine
	w.p("| CPU | %s |\n| cores | %d (GOMAXPROCS %d) |\n| OS | %s, kernel %s |\n| Go | %s |\n| redis-server | %s, on %s (loopback, no persistence) |\n",
		m.CPU, m.Cores, m.GOMAXPROCS, m.OS, m.Kernel, m.Go, m.Redis, m.RedisAddr)
	waited := ""
	if r.Plan.AwaitLoad > 0 {
		waited = fmt.Sprintf(" (the run waited for a 1-minute load below %.2f, for up to 10 minutes)", r.Plan.AwaitLoad)
	}
	w.p("| load average (1, 5, 15 min) | %s at start, %s at end%s |\n", m.LoadStart, m.LoadEnd, waited)
	mods := make([]string, 0, len(m.Modules))
	for k, v := range m.Modules {
		mods = append(mods, k+" "+v)
	}
	slices.Sort(mods)
	w.p("| modules | %s |\n\n", strings.Join(mods, ", "))
}

func (w *page) floor(r *results) {
	w.p("## Floor\n\nOne round trip is a PING answered on the same connection, one after the other, measured in every "+
		"round of the uncontended scenario next to the libraries: **%.1f µs** through go-redis (p50 %.1f µs), "+
		"%.1f µs on a bare socket (p50 %.1f µs). "+
		"A Lock+Unlock cycle cannot cost less than two round trips (%.1f µs); a nested Lock or Unlock not less than one. "+
		"Hand-off gaps below are in units of the go-redis round trip.\n\n",
		us(r.Floor.RTT), us(r.Floor.P50), us(r.Floor.Raw), us(r.Floor.RawP50), 2*us(r.Floor.RTT))
}

func (w *page) targets(r *results) {
	ts := r.targets()
	if len(ts) == 0 {
		return
	}
	w.p("## Targets for remutex\n\n")
	w.p("Each figure of remutex next to the same figure of the peer with the best one in this run (or of the peer named in the goal); " +
		"*ratio* is remutex's over the peer's. Figures with the goal *reported* have none.\n\n")
	w.p("| target | goal | remutex | peer | ratio | met |\n|---|---|---|---|---|---|\n")
	for _, t := range ts {
		met := "—"
		if t.Known {
			met = "no"
			if t.Met {
				met = "yes"
			}
		}
		w.p("| %s | %s | %s | %s | %s | %s |\n", t.What, t.Goal, t.Remutex, t.Peer, t.Ratio, met)
	}
	w.p("\n")
}

func (w *page) uncontended(r *results) {
	if len(r.Uncontended) == 0 {
		return
	}
	w.p("## (a, e) Uncontended Lock+Unlock cycle\n\n")
	w.p("One client, one lock, cycles back to back for %d rounds of %v per library, the rounds interleaved and each beginning one library further along. "+
		"*cycle* is the median of the rounds' mean cycle time; *× floor* divides it by two PING round trips. "+
		"Round trips are write bursts counted on the client's sockets; commands are what clients sent "+
		"(RESP arrays counted on their sockets), *executed* is what the server ran, counting the commands run inside scripts (INFO commandstats). "+
		"Allocations are heap allocations of the whole process per cycle (runtime.MemStats), background goroutines included.\n\n",
		r.Plan.Rounds, r.Plan.RoundTime)
	w.p("| library | cycle µs | p50 µs | p99 µs | × floor | round trips | commands | executed | Redis CPU µs (machine-dependent) | allocs | bytes | remutex ÷ this (time) | remutex ÷ this (allocs) | remutex ÷ this (Redis CPU) |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	mine, _ := r.cycleOf(r.remutexName())
	for _, v := range r.Variants {
		c, ok := r.cycleOf(v.Name)
		if !ok {
			w.p("| %s | failed ||||||||||||| \n", v.Name)
			continue
		}
		rt, ra, rc := "", "", ""
		if mine != nil && !v.Remutex {
			rt = fmt.Sprintf("%.2f", float64(mine.Cycle)/float64(c.Cycle))
			ra = fmt.Sprintf("%.2f", mine.Allocs/c.Allocs)
			if c.CPU > 0 {
				rc = fmt.Sprintf("%.2f", float64(mine.CPU)/float64(c.CPU))
			}
		}
		w.p("| %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f | %s | %s | %s |\n",
			bold(v.Name, v.Remutex), us(c.Cycle), us(c.P50), us(c.P99), float64(c.Cycle)/float64(2*r.Floor.RTT),
			c.Bursts, c.Commands, c.Executed, us(c.CPU), c.Allocs, c.Bytes, rt, ra, rc)
	}
	w.p("\n")
}

func (w *page) contended(r *results) {
	if len(r.Contended) == 0 {
		return
	}
	rtt := r.Floor.RTT
	w.p("## (b) Contended hand-off\n\n")
	w.p("%d clients (separate connection pools) × %d goroutines on one lock for %v, in %d rounds with the libraries interleaved (each round beginning one library further along). A holder sleeps %v "+
		"(time.Sleep, so the critical section includes the timer's overshoot) and pauses %v after Unlock. "+
		"The headline is *acq/s* at this fixed hold and pause, with the hand-off *gap* in round trips beside it; "+
		"*util* is time held over wall time; *hold* is the mean time from Lock's return to the Unlock call, the sleep with its overshoot "+
		"(the same code in every library: what else runs on the processors makes it longer); *gap* runs from the Unlock call to the next holder's Lock returning "+
		"(in round trips: ÷ %.1f µs); *wait* runs from the Lock call to its return; *spread* is the most over the "+
		"fewest acquisitions of one worker; *overlaps* counts holders that found another holder inside (must be 0); "+
		"*errors* counts Lock and Unlock calls that failed (a Lock that failed is tried again). "+
		"Per acquisition: round trips of all clients, commands, Redis CPU (INFO cpu, user+sys). "+
		"acq/s, util, hold and gap are the round's with the median util (all rounds' util in brackets); "+
		"waits, spread, overlaps, errors and the costs cover all rounds.\n\n",
		contClients, contPerClient, r.Plan.ContendedTime, max(1, r.Plan.ContendedRounds), contCritical, contPause, us(rtt))
	w.p("| library | acq/s | gap RTT | gap µs | util %% | hold µs | wait p50 ms | wait p99 ms | wait max ms | spread | overlaps | errors | round trips/acq | commands/acq | executed/acq | Redis CPU µs/acq (machine-dependent) | remutex ÷ this (CPU) |\n")
	w.p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	mine := r.Contended[r.remutexName()]
	for _, v := range r.Variants {
		c, ok := r.Contended[v.Name]
		if !ok {
			w.p("| %s | failed ||||||||||||||||\n", v.Name)
			continue
		}
		rc := ""
		if mine != nil && !v.Remutex && c.CPU > 0 {
			rc = fmt.Sprintf("%.2f", float64(mine.CPU)/float64(c.CPU))
		}
		w.p("| %s | %.0f | %.1f | %.0f | %.1f %v | %.0f | %.2f | %.2f | %.2f | %s | %d | %d | %.2f | %.2f | %.1f | %.1f | %s |\n",
			bold(v.Name, v.Remutex), c.PerSecond, float64(c.GapMean)/float64(rtt), us(c.GapMean), 100*c.Utilisation, c.Rounds, us(c.HoldMean),
			ms(c.WaitP50), ms(c.WaitP99), ms(c.WaitMax), spread(c.Spread), c.Overlaps, c.Errors,
			c.Bursts, c.Commands, c.Executed, us(c.CPU), rc)
	}
	w.p("\nAcquisitions per worker: ")
	var parts []string
	for _, v := range r.Variants {
		if c, ok := r.Contended[v.Name]; ok {
			parts = append(parts, fmt.Sprintf("%s %v", v.Name, c.PerWorker))
		}
	}
	w.p("%s.\n\n", strings.Join(parts, "; "))
}

func (w *page) held(r *results) {
	if len(r.Held) == 0 {
		return
	}
	var any *heldResult
	for _, h := range r.Held {
		any = h
	}
	w.p("## (c) %d locks held by one client\n\n", any.Locks)
	w.p("One goroutine takes %d locks (lease %v) and holds them for three lease periods (%v). "+
		"Counted over those %v: round trips (write bursts on the client's sockets), commands sent, commands executed, "+
		"Redis CPU, and the most goroutines above the count before the client existed; a library is measured with the locks it "+
		"took in %v if it takes longer. "+
		"redsync and redislock have no watchdog: what a user must write is measured instead, a loop of %d goroutines that "+
		"extends every lock every lease/3, one round trip per lock. rueidislock's locks renew themselves, with a goroutine "+
		"per key of each lock. remutex uses reentrant mutexes (the default): holds belong to goroutines, "+
		"and one goroutine may hold any number of distinct locks; its single watchdog renews every hold.\n\n",
		any.Locks, any.Lease, any.Held, any.Held, r.Plan.TakeLimit, userRenewers)
	w.p("| library | renewed by | round trips | per lease/3 | commands | executed | Redis CPU ms | +goroutines | lost | taking all locks |\n")
	w.p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range r.Variants {
		h, ok := r.Held[v.Name]
		if !ok {
			continue
		}
		took := h.AcquireTime.Round(time.Millisecond).String()
		if h.Taken < h.Locks {
			took = fmt.Sprintf("only %d in %v", h.Taken, h.AcquireTime.Round(time.Millisecond))
		}
		w.p("| %s | %s | %d | %.1f | %d | %d | %.1f | %d | %d | %s |\n",
			bold(v.Name, v.Remutex), h.Renewer, h.Bursts, h.perPeriod(), h.Commands, h.Executed,
			ms(h.CPU), h.Goroutines, h.Lost, took)
	}
	w.p("\n")
}

func (w *page) scale(r *results) {
	if len(r.Scale) == 0 {
		return
	}
	w.p("## (f) Many locks in use at once\n\n")
	w.p("Clients (separate connection pools) × goroutines, each goroutine cycling Lock+Unlock on a lock of its own, back to back, "+
		"no contention; %d rounds of %v per library and size, the libraries interleaved (each round beginning one library further along). *cycles/s* is the median of the rounds "+
		"(all rounds in brackets); per cycle: round trips (write bursts on the clients' sockets), commands sent, commands executed, "+
		"Redis CPU (INFO cpu, user+sys) and heap allocations of the whole process.\n\n", r.Plan.ScaleRounds, r.Plan.ScaleTime)
	w.p("| locks | clients × goroutines | library | cycles/s | rounds (k/s) | round trips | commands | executed | Redis CPU µs (machine-dependent) | allocs | bytes | remutex ÷ this (cycles/s) | remutex ÷ this (Redis CPU) |\n")
	w.p("|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range scaleLayouts {
		of := r.scaleOf(l.locks())
		mine, _ := of(r.remutexName())
		for _, v := range r.Variants {
			c, ok := of(v.Name)
			if !ok {
				continue
			}
			rr, rc := "", ""
			if mine != nil && !v.Remutex {
				rr = fmt.Sprintf("%.2f", mine.PerSecond/c.PerSecond)
				if c.CPU > 0 {
					rc = fmt.Sprintf("%.2f", float64(mine.CPU)/float64(c.CPU))
				}
			}
			w.p("| %d | %d × %d | %s | %.0f | %s | %.2f | %.2f | %.1f | %.1f | %.1f | %.0f | %s | %s |\n",
				l.locks(), l.Clients, l.PerClient, bold(v.Name, v.Remutex), c.PerSecond, roundsOf(c.Rounds),
				c.Bursts, c.Commands, c.Executed, us(c.CPU), c.Allocs, c.Bytes, rr, rc)
		}
	}
	w.p("\n")
}

func (w *page) nested(r *results) {
	n := r.Nested
	if n == nil {
		return
	}
	w.p("## (d) Nested Lock+Unlock (remutex)\n\n")
	w.p("A goroutine that holds the lock locks and unlocks it again, %d times. Each nested call costs one round trip "+
		"(the script sets the hold count and renews the lease).\n\n", n.Pairs)
	w.p("| | mean µs | p50 µs | × PING (mean) | × PING (p50) |\n|---|---:|---:|---:|---:|\n")
	w.p("| PING, interleaved (the 1-round-trip floor) | %.1f | %.1f | 1 | 1 |\n", us(n.Ping), us(n.PingP50))
	w.p("| nested Lock | %.1f | %.1f | %.2f | %.2f |\n", us(n.Lock), us(n.LockP50), float64(n.Lock)/float64(n.Ping), float64(n.LockP50)/float64(n.PingP50))
	w.p("| nested Unlock | %.1f | %.1f | %.2f | %.2f |\n", us(n.Unlock), us(n.UnlockP50), float64(n.Unlock)/float64(n.Ping), float64(n.UnlockP50)/float64(n.PingP50))
	w.p("\nPer nested Lock+Unlock pair: %.2f round trips, %.2f commands sent, %.1f executed, %.1f allocations.\n\n",
		n.Bursts, n.Commands, n.Executed, n.Allocs)
}

func (w *page) configurations(r *results) {
	w.p("## Configurations\n\n| library | options |\n|---|---|\n")
	for _, v := range r.Variants {
		w.p("| %s | %s |\n", v.Name, v.Setup)
	}
	w.p("\nEvery library runs on go-redis v9 with default options except rueidislock, which brings its own client (rueidis). " +
		"Each Lock that a library lets fail (redsync after its tries, redislock after its ttl) is retried by the harness, " +
		"as a caller would.\n")
	if len(r.Problems) > 0 || len(r.Violations) > 0 {
		w.p("\n## Problems\n\n")
		for _, s := range r.Violations {
			w.p("- violation: %s\n", s)
		}
		for _, s := range r.Problems {
			w.p("- %s\n", s)
		}
	}
}

func bold(s string, on bool) string {
	if on {
		return "**" + s + "**"
	}
	return s
}

func spread(x float64) string {
	if x < 0 || math.IsInf(x, 1) {
		return "∞"
	}
	return fmt.Sprintf("%.2f", x)
}
