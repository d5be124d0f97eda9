package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/remutex/remutex"
)

const unlockUsage = `Usage: remutex unlock --force [--yes] NAME

Releases the lock NAME out from under its holder, as the holder's own unlock
would: its longest waiter, if any, is woken or handed the lock. Use it for a
holder that is frozen rather than dead: a dead holder's lock ends by itself
within its lease. The holder, if it runs again, finds its lease lost. The
fencing counter is kept, so tokens keep rising.

It shows the holder and asks for confirmation on standard input unless --yes
is given. It releases nothing if the lock changed hands after it was read.

Exit status: 0 released (or already free), 1 not confirmed or changed hands,
64 usage error, 69 Redis error.

Flags:
`

func (c *cli) unlock(args []string) int {
	fs := c.flagSet("unlock")
	force := fs.Bool("force", false, "required: release the lock even though another process holds it")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	names, code, ok := c.parseNames(fs, args, func(w io.Writer) {
		fmt.Fprint(w, unlockUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	})
	if !ok {
		return code
	}
	if len(names) != 1 {
		return c.usageError("unlock: want exactly one lock name (usage: remutex unlock --force [--yes] NAME)")
	}
	if !*force {
		return c.usageError("unlock: needs --force: it takes the lock away from whoever holds it")
	}
	name := names[0]
	if err := checkName(name); err != nil {
		return c.usageError("unlock: %v", err)
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
	return c.forceUnlock(ctx, locks, name, *yes)
}

// forceUnlock shows who holds lock name, asks unless yes, and releases the
// holds it showed.
func (c *cli) forceUnlock(ctx context.Context, locks *remutex.Client, name string, yes bool) int {
	st, err := readStatus(ctx, locks, name)
	switch {
	case err != nil:
		return c.fail(redisErr{err})
	case st.Error != "":
		return c.fail(redisErr{fmt.Errorf("lock %q: %s; not released", name, st.Error)})
	case !st.Held:
		fmt.Fprintf(c.stdout, "lock %q is not held; nothing to release\n", name)
		return exitOK
	}
	owners := make([]string, len(st.Holders))
	desc := make([]string, len(st.Holders))
	for i, h := range st.Holders {
		owners[i] = h.Owner
		desc[i] = fmt.Sprintf("%s, hold count %d", h.describe(), h.Count)
	}
	held := fmt.Sprintf("held by %s, with %s of its lease left", strings.Join(desc, "; "), describeTTL(st.TTLMillis))
	if !yes && !c.confirm(fmt.Sprintf("Lock %q is %s.\nRelease it? Its holder loses it and may still be working.", name, held)) {
		fmt.Fprintln(c.stderr, "not released")
		return exitDeclined
	}

	released, err := locks.ForceUnlock(ctx, name, owners...)
	switch {
	case err != nil:
		return c.fail(redisErr{err})
	case !released:
		return c.changedHands(ctx, locks, name)
	}
	fmt.Fprintf(c.stdout, "released lock %q, %s; its next waiter, if any, was told\n", name, held)
	return exitOK
}

// confirm asks question on stderr and reports whether the answer on stdin
// is yes.
func (c *cli) confirm(question string) bool {
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true
	}
	return false
}

// changedHands reports a lock whose holders, as shown, were gone when the
// release came: released meanwhile (done), or taken by another (declined).
func (c *cli) changedHands(ctx context.Context, locks *remutex.Client, name string) int {
	now, err := readStatus(ctx, locks, name)
	if err != nil {
		return c.fail(redisErr{err})
	}
	if !now.Held {
		fmt.Fprintf(c.stdout, "lock %q was released meanwhile; nothing to release\n", name)
		return exitOK
	}
	others := make([]string, len(now.Holders))
	for i, h := range now.Holders {
		others[i] = h.describe()
	}
	c.errorf("lock %q changed hands meanwhile (now held by %s); nothing released", name, strings.Join(others, ", "))
	return exitDeclined
}
