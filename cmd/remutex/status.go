package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
)

const statusUsage = `Usage: remutex status [--json] NAME...

Shows, for each lock NAME, of each kind found under the name (a mutex, as
remutex run takes and remutex.DistMutex is; a read/write lock, as run --read
and --write take and remutex.DistRWMutex is; a semaphore, as run --permits
takes and remutex.DistSemaphore is; independent locks that may share a
name): its kind and state, each hold with its owner token (<client
id>:<goroutine id>.<n>, one per acquisition), mode, host, pid, hold count (a semaphore's holder: its
permits) and remaining lease, the last fencing token handed out, the
waiters queued in Redis (and how many of them wait to write), and the
Clients listening for the lock's messages (waiting for it, or having just
waited). Below, when any lock has waiters, a second table lists them in
the order in which they get the lock: who waits (owner, host, pid), for
what (WANTS: lock, read, write, a semaphore's N permits, or an election's
term), and for how
long (by the waiting process's clock). It changes nothing.

STATE is free, held (a mutex), running, done, failed or not done (a
once, as remutex once runs it and remutex.DistOnce is: the run under way,
a run succeeded, the latest run failed), held (a mutex), kept (a mutex that nobody holds, kept taken
by its minimum hold: run --min-hold), write (a read/write lock held for
writing), read ×N (held for reading by N readers), or, for a semaphore of S
permits, held H/S (H of them held) or free 0/S. MODE is a hold's: write or
read for a read/write lock, - for the other kinds. TTL is each hold's
remaining lease; for a kept lock, the time its minimum hold has left, and
HOLDER the owner whose run it was (COUNT 0).

--json prints a JSON array with one object per lock NAME:
  {"name", "key", "kind", "held", "size",
   "holders": [{"owner", "count", "read", "kept", "ttl_ms", "host", "pid"}],
   "ttl_ms", "fence", "readers", "queued",
   "waiters": [{"owner", "read", "permits", "host", "pid", "since"}],
   "writers_waiting", "subscribers", "others", "error"}
kind is "mutex", "rwmutex" (a read/write lock), "semaphore" or "" (nothing
under the name); key is where its holds live (a read/write lock's writer
hash ends in ":rw", a semaphore's holders hash in ":sem"); held is true
while the lock is taken, also when kept; size is a semaphore's number of
permits (0 for the other kinds); count is a hold count, a semaphore
holder's permits; read marks a read hold; kept marks a hold kept by its
minimum hold (its holder released it: count 0, ttl_ms the time left); ttl_ms
is the longest lease left, 0 for a free lock; fence is 0 if no fencing
token was ever handed out; readers counts the read holds; waiters are the
queued waiters in arrival order, read marking a reader and permits the
permits a semaphore's waiter asks for, since (RFC 3339) when it began to
wait by its own clock; writers_waiting counts those that wait to write.
others (omitted when empty) holds, as objects of the same form, the
locks of the other kinds that have state under the same name; error
(omitted when empty) says why the key is not a lock.

A third table lists the runs of onces: the run that made each done (who,
host, pid, when it started, how long it took) and the latest failed run
(kept a minute), with its error. In --json a once's object has "once":
{"done", "run", "failed"}, each run {"owner", "host", "pid", "started",
"duration_ms", "error"}.

Exit status: 0 done, 64 usage error, 69 Redis error or a key that is not a lock.

Flags:
`

func (c *cli) status(args []string) int {
	fs := c.flagSet("status")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	names, code, ok := c.parseNames(fs, args, func(w io.Writer) {
		fmt.Fprint(w, statusUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	})
	if !ok {
		return code
	}
	if len(names) == 0 {
		return c.usageError("status: no lock name given (usage: remutex status [--json] NAME...)")
	}
	for _, name := range names {
		if err := checkName(name); err != nil {
			return c.usageError("status: %v", err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb, err := c.connect(ctx)
	if err != nil {
		return c.fail(err)
	}
	defer rdb.Close()
	locks := c.lockClient(rdb)
	defer locks.Close() // before rdb.Close

	code = exitOK
	all := make([]lockStatus, 0, len(names))
	for _, name := range names {
		st, err := readStatus(ctx, locks, name)
		if err != nil {
			return c.fail(redisErr{err})
		}
		if st.Error != "" {
			c.errorf("lock %q: %s", name, st.Error)
			code = exitRedis
		}
		all = append(all, st)
	}
	if *asJSON {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(all); err != nil {
			c.errorf("%v", err)
			return exitRedis
		}
		return code
	}
	if err := printStatus(c.stdout, all); err != nil {
		c.errorf("%v", err)
		return exitRedis
	}
	return code
}

// printStatus prints a table: one line per hold of each lock, one for a
// lock that nobody holds; a lock of each kind under a name has its own
// lines. If any lock has waiters, a blank line and a table of them follow.
func printStatus(w io.Writer, all []lockStatus) error {
	rows := [][]string{{"NAME", "STATE", "KIND", "HOLDER", "MODE", "HOST", "PID", "COUNT", "TTL", "FENCE", "QUEUED", "WRITERS-WAITING", "SUBSCRIBERS"}}
	waiting := [][]string{{"NAME", "KIND", "WAITER", "WANTS", "HOST", "PID", "WAITING"}}
	now := time.Now()
	for _, st := range all {
		for _, k := range st.kinds() {
			rows = append(rows, statusRows(k)...)
			for _, wt := range k.Waiters {
				host, pid := "-", "-"
				if wt.Host != "" {
					host, pid = wt.Host, strconv.Itoa(wt.PID)
				}
				waiting = append(waiting, []string{printable(k.Name), k.Kind, wt.Owner, wt.wants(k.Kind), host, pid,
					describeTTL(max(now.Sub(wt.Since), 0).Milliseconds())})
			}
		}
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	if len(waiting) > 1 {
		if _, err := io.WriteString(w, "\n"); err != nil {
			return err
		}
		if err := writeTable(w, waiting); err != nil {
			return err
		}
	}
	return printOnces(w, all)
}

// printOnces prints, for the onces among all that have a record, a table
// of their runs: the one that made it done, and the latest failed one.
func printOnces(w io.Writer, all []lockStatus) error {
	rows := [][]string{{"NAME", "RUN", "BY", "HOST", "PID", "STARTED", "TOOK", "ERROR"}}
	add := func(name, what string, r *onceRun) {
		if r == nil {
			return
		}
		errText := "-"
		if r.Error != "" {
			errText = r.Error
		}
		rows = append(rows, []string{printable(name), what, r.Owner, r.Host, strconv.Itoa(r.PID),
			r.Started.UTC().Format(time.RFC3339), describeTTL(r.DurationMs), errText})
	}
	for _, st := range all {
		for _, k := range st.kinds() {
			if k.Once != nil {
				add(k.Name, "done", k.Once.Run)
				add(k.Name, "failed", k.Once.Failed)
			}
		}
	}
	if len(rows) == 1 {
		return nil
	}
	if _, err := io.WriteString(w, "\n"); err != nil {
		return err
	}
	return writeTable(w, rows)
}

// printable is a lock name as the tables show it: quoted if it holds
// characters that do not print (no control characters on the terminal).
func printable(name string) string {
	if strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return strconv.Quote(name)
	}
	return name
}

// statusRows are the table's lines for one kind of lock under a name.
func statusRows(st lockStatus) [][]string {
	name := printable(st.Name)
	kind, fence, writers := "-", "-", "-"
	if st.Kind != "" {
		kind = st.Kind
	}
	if st.Fence != 0 {
		fence = strconv.FormatInt(st.Fence, 10)
	}
	if st.Kind == kindRWMutex {
		writers = strconv.FormatInt(st.WritersWaiting, 10)
	}
	queued, subs := strconv.FormatInt(st.Queued, 10), strconv.FormatInt(st.Subscribers, 10)
	if !st.Held || st.Error != "" {
		return [][]string{{name, st.state(), kind, "-", "-", "-", "-", "-", "-", fence, queued, writers, subs}}
	}
	var rows [][]string
	for _, h := range st.Holders {
		host, pid, mode := "-", "-", "-"
		if h.Host != "" {
			host, pid = h.Host, strconv.Itoa(h.PID)
		}
		switch {
		case st.Kind != kindRWMutex:
		case h.Read:
			mode = "read"
		default:
			mode = "write"
		}
		rows = append(rows, []string{name, st.state(), kind, h.Owner, mode, host, pid,
			strconv.FormatInt(h.Count, 10), describeTTL(h.TTLMillis), fence, queued, writers, subs})
	}
	return rows
}
