package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
	"unicode"

	"github.com/remutex/remutex"
)

const leaderUsage = `Usage: remutex leader [--watch] [--json] NAME

Prints the leader of the election NAME (as remutex elect and
remutex.DistElection campaign in it) in one line:

  TERM SINCE HOST PID VALUE

TERM is the term's number (its fencing token, rising from term to term),
SINCE when the term began (RFC 3339 in UTC, to the millisecond, by the
Redis server's clock), HOST and PID where the leader runs, and VALUE what
it published (remutex elect --value), to the end of the line. A VALUE that
is empty, holds a control character (a newline) or a space at either end,
or begins with a double quote is printed as a JSON string, in double
quotes; any other is printed as it is. In a shell:

  read -r term since host pid value < <(remutex leader jobs)

With --json the line is a JSON object instead:
  {"name", "value", "term", "since", "host", "pid", "owner"}
(owner: the owner token of the leader's hold, which status shows).

With --watch, remutex prints the leader (if one leads), then a line for
each change of leader or value, in order and at once, until it is
interrupted (SIGINT, SIGTERM or SIGHUP: exit status 0). Terms never go back,
and each term shows at least once, but a value that a later one of the same
term replaced may be skipped. A term that ends without a successor (a
resigned or dead leader, nobody campaigning) prints nothing: the next line
is the next leader's.

Exit status: 0 a leader was printed (--watch: interrupted); 1 nobody leads
(without --watch); 64 usage error; 69 Redis error, or a key of another
kind under the election's name.

Flags:
`

// exitNoLeader is leader's status when nobody leads.
const exitNoLeader = 1

func (c *cli) leader(args []string) int {
	fs := c.flagSet("leader")
	watch := fs.Bool("watch", false, "print a line for each change of leader, until interrupted")
	asJSON := fs.Bool("json", false, "print a JSON object per line")
	names, code, ok := c.parseNames(fs, args, func(w io.Writer) {
		fmt.Fprint(w, leaderUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	})
	if !ok {
		return code
	}
	if len(names) != 1 {
		return c.usageError("leader: want one election name, got %d (usage: remutex leader [--watch] [--json] NAME)", len(names))
	}
	name := names[0]
	if err := checkName(name); err != nil {
		return c.usageError("leader: %v", err)
	}
	print := func(l remutex.Leader) error { return printLeader(c.stdout, name, l, *asJSON) }

	if !*watch {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.withElection(ctx, name, nil, func(e *remutex.DistElection) int {
			l, err := e.Leader(ctx)
			switch {
			case errors.Is(err, remutex.ErrNoLeader):
				c.errorf("election %q: nobody leads", name)
				return exitNoLeader
			case err != nil:
				c.errorf("%v", err)
				return exitRedis
			}
			return c.printed(print(l))
		})
	}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	ctx, interrupted := watchSignals(sigs)
	defer interrupted()
	var seen lastError
	return c.withElection(ctx, name, &seen, func(e *remutex.DistElection) int {
		for l := range e.Observe(ctx) {
			if code := c.printed(print(l)); code != exitOK {
				return code
			}
		}
		if interrupted() != nil {
			return exitOK
		}
		// Observe ended by itself: a permanent error, which it reported.
		c.errorf("watching election %q ended%s", name, seen.describe())
		return exitRedis
	})
}

// withElection connects, and returns f's status for the election name, or
// the status of a failure to connect. seen, if not nil, gets the errors the
// Client reports.
func (c *cli) withElection(ctx context.Context, name string, seen *lastError, f func(e *remutex.DistElection) int) int {
	rdb, err := c.connect(ctx)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return exitOK // interrupted while connecting (--watch)
		}
		return c.fail(err)
	}
	defer rdb.Close()
	var opts []remutex.Option
	if seen != nil {
		opts = append(opts, remutex.WithErrorHandler(seen.set))
	}
	locks := c.lockClient(rdb, opts...)
	defer locks.Close() // before rdb.Close
	return f(locks.NewElection(name))
}

// printed is the exit status after printing a leader with error err.
func (c *cli) printed(err error) int {
	if err != nil {
		c.errorf("%v", err)
		return exitRedis
	}
	return exitOK
}

// leaderJSON is a leader as leader --json prints it.
type leaderJSON struct {
	Name  string    `json:"name"`
	Value string    `json:"value"`
	Term  int64     `json:"term"`
	Since time.Time `json:"since"`
	Host  string    `json:"host"`
	PID   int       `json:"pid"`
	Owner string    `json:"owner"`
}

// sinceLayout is how leader prints a term's start: RFC 3339 in UTC, to the
// millisecond.
const sinceLayout = "2006-01-02T15:04:05.000Z07:00"

// printLeader writes l, the leader of the election name, as one line: text
// (TERM SINCE HOST PID VALUE) or, with asJSON, a JSON object.
func printLeader(w io.Writer, name string, l remutex.Leader, asJSON bool) error {
	since := l.Since.UTC().Truncate(time.Millisecond)
	var line []byte
	if asJSON {
		var err error
		if line, err = marshalLine(leaderJSON{Name: name, Value: l.Value, Term: l.Term, Since: since, Host: l.Host, PID: l.PID, Owner: l.Owner}); err != nil {
			return err
		}
	} else {
		line = []byte(fmt.Sprintf("%d %s %s %d %s\n", l.Term, since.Format(sinceLayout), orDash(l.Host), l.PID, textValue(l.Value)))
	}
	_, err := w.Write(line)
	return err
}

// marshalLine is v in JSON on one line, ending in a newline, with no HTML
// escapes ('<' stays '<').
func marshalLine(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return b.Bytes(), err
}

// textValue is a leader's value as the text line ends in it: as it is, or
// as a JSON string where it could not be read back from the line as it is.
func textValue(v string) string {
	plain := v != "" && !strings.HasPrefix(v, `"`) &&
		strings.TrimSpace(v) == v && !strings.ContainsFunc(v, unicode.IsControl)
	if plain {
		return v
	}
	b, _ := marshalLine(v) // a string always marshals
	return strings.TrimSuffix(string(b), "\n")
}

// orDash is s, or "-" if it is empty (a field of the text line).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
