package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const unlockUsage = `Usage: remutex unlock --force [--yes] NAME

Deletes the lock NAME out from under its holder and wakes its waiters (it
publishes "r" on the lock's release channel, as a release does). Use it for a
holder that is frozen rather than dead: a dead holder's lock ends by itself
within its lease. The holder, if it runs again, finds its lease lost. The
fencing counter is kept, so tokens keep rising.

It shows the holder and asks for confirmation on standard input unless --yes
is given. It deletes nothing if the lock changed hands after it was read.

Exit status: 0 deleted (or already free), 1 not confirmed or changed hands,
64 usage error, 69 Redis error.

Flags:
`

// unlockScript deletes a lock's hash if its owners are still those the user
// saw, and announces the release. KEYS = hash; ARGV = the owners seen, sorted
// and joined by newlines; the publish command; the release channel.
// Returns {1, receivers} when deleted, {0, current owners} when they changed.
var unlockScript = redis.NewScript(`
local t = redis.call('type', KEYS[1])
if type(t) == 'table' then t = t['ok'] end
if t ~= 'hash' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a remutex lock')
end
local owners = redis.call('hkeys', KEYS[1])
table.sort(owners)
local cur = table.concat(owners, '\n')
if cur ~= ARGV[1] or cur == '' then return {0, cur} end
redis.call('del', KEYS[1])
return {1, redis.call(ARGV[2], ARGV[3], 'r')}
`)

func (c *cli) unlock(args []string) int {
	fs := c.flagSet("unlock")
	force := fs.Bool("force", false, "required: delete the lock even though another process holds it")
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
	name, prefix := names[0], c.conn.keyPrefix()
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

	st, err := readStatus(ctx, rdb, prefix, name)
	switch {
	case err != nil:
		return c.fail(redisErr{err})
	case st.Error != "":
		return c.fail(redisErr{fmt.Errorf("lock %q: %s; not deleted", name, st.Error)})
	case !st.Held:
		fmt.Fprintf(c.stdout, "lock %q is not held; nothing to delete\n", name)
		return exitOK
	}
	owners := make([]string, len(st.Holders))
	desc := make([]string, len(st.Holders))
	for i, h := range st.Holders {
		owners[i] = h.Owner
		desc[i] = fmt.Sprintf("%s (hold count %d)", h.Owner, h.Count)
	}
	sort.Strings(owners)
	held := fmt.Sprintf("held by %s with %s of its lease left", strings.Join(desc, ", "), describeTTL(st.TTLMillis))

	if !*yes {
		fmt.Fprintf(c.stderr, "Lock %q is %s.\nDelete it? Its holder loses it and may still be working. [y/N] ", name, held)
		answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
		switch strings.ToLower(strings.TrimSpace(answer)) {
		case "y", "yes":
		default:
			fmt.Fprintln(c.stderr, "not deleted")
			return exitDeclined
		}
	}

	k := keysFor(prefix, name)
	pub, err := publishCommand(ctx, rdb, k)
	if err != nil {
		return c.fail(redisErr{err})
	}
	v, err := unlockScript.Run(ctx, rdb, []string{k.hash}, strings.Join(owners, "\n"), pub, k.channel).Slice()
	if err != nil {
		return c.fail(redisErr{fmt.Errorf("lock %q: %w", name, err)})
	}
	if len(v) != 2 {
		return c.fail(redisErr{fmt.Errorf("lock %q: unexpected reply %v", name, v)})
	}
	if done, _ := v[0].(int64); done != 1 {
		now, _ := v[1].(string)
		if now == "" {
			fmt.Fprintf(c.stdout, "lock %q was released meanwhile; nothing to delete\n", name)
			return exitOK
		}
		c.errorf("lock %q changed hands meanwhile (now held by %s); nothing deleted", name, strings.ReplaceAll(now, "\n", ", "))
		return exitDeclined
	}
	fmt.Fprintf(c.stdout, "deleted lock %q, %s; its waiters were told it is free\n", name, held)
	return exitOK
}
