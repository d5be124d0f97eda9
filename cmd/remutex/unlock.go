package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/remutex/remutex"
)

const unlockUsage = `Usage: remutex unlock --force [--yes] [--owner OWNER]... NAME

Releases the lock NAME out from under its holders, as their own unlocks
would, whatever its kind: a mutex's hold, a read/write lock's write hold and
read holds, a semaphore's holders with all their permits (a mutex, a
read/write lock and a semaphore of one name are independent locks: the
holds of all are released). The lock's waiters are woken or handed the lock
as after an unlock: a mutex's longest waiter; a read/write lock's readers at
the head of its queue together, or its first waiting writer once no reader
is left; a semaphore's waiters at the head of its queue whose requests fit
in the permits now free, in arrival order. Use it for a holder that is
frozen rather than dead: a dead holder's lock ends by itself within its
lease. Each holder, if it runs again, finds its lease lost. The fencing
counter is kept, so tokens keep rising; so is a semaphore's size. A mutex
kept taken by its minimum hold (run --min-hold; status shows it as kept),
which nobody holds, is freed too.

--owner releases only the holds of that owner token (as status shows it in
HOLDER), of every kind; give it again for several: for instance the one
frozen holder of a semaphore, leaving its other holders their permits.

It shows the holds and asks for confirmation on standard input unless --yes
is given. It releases only the holds it showed, so nothing of a lock that
changed hands after it was read, and it names those that had ended
meanwhile.

Exit status: 0 released (or already free), 1 not confirmed or changed hands,
64 usage error, 69 Redis error.

Flags:
`

func (c *cli) unlock(args []string) int {
	fs := c.flagSet("unlock")
	force := fs.Bool("force", false, "required: release the lock even though another process holds it")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	var owners ownersFlag
	fs.Var(&owners, "owner", "release only the holds of this owner `token` (as status shows it); repeat for several")
	names, code, ok := c.parseNames(fs, args, func(w io.Writer) {
		fmt.Fprint(w, unlockUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
	})
	if !ok {
		return code
	}
	if len(names) != 1 {
		return c.usageError("unlock: want exactly one lock name (usage: remutex unlock --force [--yes] [--owner OWNER]... NAME)")
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
	return c.forceUnlock(ctx, locks, name, owners, *yes)
}

// ownersFlag is --owner, given any number of times: the owner tokens whose
// holds unlock releases; none: every hold.
type ownersFlag []string

func (o *ownersFlag) String() string { return strings.Join(*o, ",") }

func (o *ownersFlag) Set(s string) error {
	if s == "" {
		return errors.New("want an owner token, as status shows it")
	}
	*o = append(*o, s)
	return nil
}

// only returns the holds of holds that are of owners: all of them if
// owners is empty.
func (o ownersFlag) only(holds []hold) []hold {
	if len(o) == 0 {
		return holds
	}
	var mine []hold
	for _, h := range holds {
		if slices.Contains(o, h.Owner) {
			mine = append(mine, h)
		}
	}
	return mine
}

// hold is one hold of a lock, as shown: its lock's kind and its holder.
type hold struct {
	kind string
	holder
}

func (h hold) String() string { return h.describeHold(h.kind) }

// holdsOf returns the holds of every kind of lock in st.
func holdsOf(st lockStatus) []hold {
	var holds []hold
	for _, k := range st.kinds() {
		for _, h := range k.Holders {
			holds = append(holds, hold{kind: k.Kind, holder: h})
		}
	}
	return holds
}

// forceUnlock shows the holds of lock name (those of owners, if given),
// asks unless yes, and releases the holds it showed.
func (c *cli) forceUnlock(ctx context.Context, locks *remutex.Client, name string, owners ownersFlag, yes bool) int {
	st, err := readStatus(ctx, locks, name)
	switch {
	case err != nil:
		return c.fail(redisErr{err})
	case st.Error != "":
		return c.fail(redisErr{fmt.Errorf("lock %q: %s; not released", name, st.Error)})
	}
	holds := owners.only(holdsOf(st))
	switch {
	case len(holds) == 0 && len(owners) > 0:
		fmt.Fprintf(c.stdout, "lock %q is not held by %s; nothing to release\n", name, strings.Join(owners, " or "))
		return exitOK
	case len(holds) == 0:
		fmt.Fprintf(c.stdout, "lock %q is not held; nothing to release\n", name)
		return exitOK
	}
	if !yes && !c.confirm(question(name, holds)) {
		fmt.Fprintln(c.stderr, "not released")
		return exitDeclined
	}

	released, ended, err := releaseHolds(ctx, locks, name, holds)
	switch {
	case err != nil:
		return c.fail(redisErr{err})
	case len(released) == 0 && len(owners) > 0:
		fmt.Fprintf(c.stdout, "lock %q: the holds of %s had ended meanwhile; nothing to release\n", name, strings.Join(owners, " or "))
		return exitOK
	case len(released) == 0:
		return c.changedHands(ctx, locks, name)
	}
	for _, h := range ended {
		fmt.Fprintf(c.stdout, "lock %q: the hold of %s had ended meanwhile; not released\n", name, h.describe())
	}
	told := "the waiters it passed to, if any, were told"
	switch {
	case len(released) > 1:
		fmt.Fprintf(c.stdout, "released lock %q, %d holds:\n  %s\n%s\n", name, len(released), joinHolds(released, ";\n  "), told)
		return exitOK
	case released[0].kind == kindMutex:
		told = "its next waiter, if any, was told"
	}
	fmt.Fprintf(c.stdout, "released lock %q, %s; %s\n", name, released[0], told)
	return exitOK
}

// question asks whether to release the holds of lock name.
func question(name string, holds []hold) string {
	switch {
	case len(holds) > 1:
		return fmt.Sprintf("Lock %q has %d holds:\n  %s.\nRelease them? Their holders lose them and may still be working.", name, len(holds), joinHolds(holds, ";\n  "))
	case holds[0].Kept:
		return fmt.Sprintf("Lock %q is %s.\nRelease it? Nobody holds it; its minimum hold ends now, so the job may run again at once.", name, holds[0])
	}
	return fmt.Sprintf("Lock %q is %s.\nRelease it? Its holder loses it and may still be working.", name, holds[0])
}

// releaseHolds releases holds with ForceUnlock, owner by owner, so that it
// can tell the holds it released from those that had ended meanwhile (an
// owner's holds of every kind go together).
func releaseHolds(ctx context.Context, locks *remutex.Client, name string, holds []hold) (released, ended []hold, err error) {
	var owners []string
	byOwner := map[string][]hold{}
	for _, h := range holds {
		if byOwner[h.Owner] == nil {
			owners = append(owners, h.Owner)
		}
		byOwner[h.Owner] = append(byOwner[h.Owner], h)
	}
	for _, owner := range owners {
		ok, err := locks.ForceUnlock(ctx, name, owner)
		switch {
		case err != nil:
			return released, ended, err
		case ok:
			released = append(released, byOwner[owner]...)
		default:
			ended = append(ended, byOwner[owner]...)
		}
	}
	return released, ended, nil
}

func joinHolds(holds []hold, sep string) string {
	s := make([]string, len(holds))
	for i, h := range holds {
		s[i] = h.String()
	}
	return strings.Join(s, sep)
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
// release came: released meanwhile (done), or taken by others (declined).
func (c *cli) changedHands(ctx context.Context, locks *remutex.Client, name string) int {
	now, err := readStatus(ctx, locks, name)
	if err != nil {
		return c.fail(redisErr{err})
	}
	holds := holdsOf(now)
	if len(holds) == 0 {
		fmt.Fprintf(c.stdout, "lock %q was released meanwhile; nothing to release\n", name)
		return exitOK
	}
	others := make([]string, len(holds))
	for i, h := range holds {
		others[i] = h.describe()
	}
	c.errorf("lock %q changed hands meanwhile (now held by %s); nothing released", name, strings.Join(others, ", "))
	return exitDeclined
}
