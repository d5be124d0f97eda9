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

Shows, for each lock NAME: its holder's owner token (<client id>:<goroutine
id>), host, pid and hold count, the remaining lease, the last fencing token
handed out, the waiters queued in Redis, and the Clients listening for the
lock's messages (waiting for it, or having just waited). It changes nothing.

--json prints a JSON array with one object per lock:
  {"name", "key", "held", "holders": [{"owner", "count", "host", "pid"}],
   "ttl_ms", "fence", "queued", "subscribers", "error"}
ttl_ms is 0 for a free lock; fence is 0 if no fencing token was ever handed
out; error (omitted when empty) says why the key is not a lock.

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

// printStatus prints a table, one line per holder (a lock has one holder;
// more would be a lock written by something else).
func printStatus(w io.Writer, all []lockStatus) error {
	rows := [][]string{{"NAME", "STATE", "HOLDER", "HOST", "PID", "COUNT", "TTL", "FENCE", "QUEUED", "SUBSCRIBERS"}}
	for _, st := range all {
		name := st.Name
		if strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
			name = strconv.Quote(name) // no control characters on the terminal
		}
		fence := "-"
		if st.Fence != 0 {
			fence = strconv.FormatInt(st.Fence, 10)
		}
		queued, subs := strconv.FormatInt(st.Queued, 10), strconv.FormatInt(st.Subscribers, 10)
		switch {
		case st.Error != "":
			rows = append(rows, []string{name, "not a lock", "-", "-", "-", "-", "-", fence, queued, subs})
		case !st.Held:
			rows = append(rows, []string{name, "free", "-", "-", "-", "-", "-", fence, queued, subs})
		default:
			for _, h := range st.Holders {
				host, pid := "-", "-"
				if h.Host != "" {
					host, pid = h.Host, strconv.Itoa(h.PID)
				}
				rows = append(rows, []string{name, "held", h.Owner, host, pid, strconv.FormatInt(h.Count, 10), describeTTL(st.TTLMillis), fence, queued, subs})
			}
		}
	}
	return writeTable(w, rows)
}
