package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// defaultAddr is the Redis server used without flags and environment.
const defaultAddr = "127.0.0.1:6379"

// connFlags are the connection flags. They are registered on the global flag
// set and on each command's, sharing their values, so they may stand before
// or after the command name.
type connFlags struct {
	addr, url, cluster, prefix optString
}

// optString is a string flag that remembers whether it was given. Unlike
// flag.StringVar, registering it again does not reset it to a default.
type optString struct {
	v   string
	set bool
}

func (o *optString) String() string { return o.v }

func (o *optString) Set(s string) error {
	o.v, o.set = s, true
	return nil
}

func (f *connFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.addr, "addr", "Redis server `HOST:PORT` (default: $REDIS_ADDR, else "+defaultAddr+")")
	fs.Var(&f.url, "url", "Redis `URL`, redis://[user:password@]host:port[/db] or rediss://... (default: $REDIS_URL)")
	fs.Var(&f.cluster, "cluster", "comma-separated `ADDRS` of a Redis Cluster, or a redis:// cluster URL")
	fs.Var(&f.prefix, "prefix", "key `PREFIX` of the locks (default \""+remutex.DefaultKeyPrefix+"\")")
}

// check reports conflicting connection flags.
func (f *connFlags) check() error {
	var given []string
	for _, o := range []struct {
		name string
		v    *optString
	}{{"--addr", &f.addr}, {"--url", &f.url}, {"--cluster", &f.cluster}} {
		if o.v.set {
			given = append(given, o.name)
		}
	}
	if len(given) > 1 {
		return fmt.Errorf("%s: give only one of --addr, --url and --cluster", strings.Join(given, " and "))
	}
	if strings.ContainsAny(f.prefix.v, "{}") {
		// The lock's name in braces is the hash tag that keeps its keys in
		// one cluster slot; braces in the prefix would replace it.
		return fmt.Errorf("--prefix %q: must not contain '{' or '}'", f.prefix.v)
	}
	return nil
}

// keyPrefix returns the key prefix of the locks.
func (f *connFlags) keyPrefix() string {
	if f.prefix.set {
		return f.prefix.v
	}
	return remutex.DefaultKeyPrefix
}

// options builds the redis client's options from the flags and, where none
// is given, the environment. It returns cluster options for --cluster, else
// options for a single server, and a description of the target for messages.
func (f *connFlags) options(getenv func(string) string) (*redis.Options, *redis.ClusterOptions, string, error) {
	switch {
	case f.cluster.set:
		v := strings.TrimSpace(f.cluster.v)
		if strings.Contains(v, "://") {
			o, err := redis.ParseClusterURL(v)
			if err != nil {
				return nil, nil, "", fmt.Errorf("--cluster: %w", err)
			}
			return nil, o, "cluster " + strings.Join(o.Addrs, ","), nil
		}
		var addrs []string
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				addrs = append(addrs, a)
			}
		}
		if len(addrs) == 0 {
			return nil, nil, "", errors.New("--cluster: no address given")
		}
		return nil, &redis.ClusterOptions{Addrs: addrs}, "cluster " + strings.Join(addrs, ","), nil
	case f.url.set:
		return parseURL("--url", f.url.v)
	case f.addr.set:
		return addrOptions("--addr", f.addr.v)
	case getenv("REDIS_URL") != "":
		return parseURL("REDIS_URL", getenv("REDIS_URL"))
	case getenv("REDIS_ADDR") != "":
		return addrOptions("REDIS_ADDR", getenv("REDIS_ADDR"))
	}
	return &redis.Options{Addr: defaultAddr}, nil, defaultAddr, nil
}

func parseURL(from, u string) (*redis.Options, *redis.ClusterOptions, string, error) {
	o, err := redis.ParseURL(u)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s: %w", from, err)
	}
	return o, nil, o.Addr, nil
}

func addrOptions(from, addr string) (*redis.Options, *redis.ClusterOptions, string, error) {
	if addr == "" || strings.Contains(addr, "://") || !strings.Contains(addr, ":") {
		return nil, nil, "", fmt.Errorf("%s: %q is not HOST:PORT (use --url or REDIS_URL for URLs)", from, addr)
	}
	return &redis.Options{Addr: addr}, nil, addr, nil
}

// connect returns a redis client for the flags and environment, after
// checking with PING that the server answers. A bad flag or variable is a
// usageErr; an unreachable server a redisErr.
func (c *cli) connect(ctx context.Context) (redis.UniversalClient, error) {
	o, co, target, err := c.conn.options(c.getenv)
	if err != nil {
		return nil, usageErr{err}
	}
	// Without ContextTimeoutEnabled go-redis keeps waiting for a reply past
	// the context's deadline, up to its read timeout: --wait would overrun
	// against a server that stopped answering.
	var rdb redis.UniversalClient
	if co != nil {
		co.ContextTimeoutEnabled = true
		rdb = redis.NewClusterClient(co)
	} else {
		o.ContextTimeoutEnabled = true
		rdb = redis.NewClient(o)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// go-redis gives up a read at its deadline, not when ctx is cancelled:
	// wait for the PING here, so that a signal ends the wait at once.
	ping := make(chan error, 1)
	go func() { ping <- rdb.Ping(pctx).Err() }()
	select {
	case err = <-ping:
	case <-pctx.Done():
		err = pctx.Err()
	}
	if err != nil {
		// Also when ctx ended: the caller tells why.
		_ = rdb.Close()
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			// The caller's bound passed (go-redis says "i/o timeout").
			err = errNoAnswer
		}
		return nil, redisErr{fmt.Errorf("redis %s: %w", target, err)}
	}
	return rdb, nil
}

// errNoAnswer is connect's error when the server did not answer PING
// before the caller's deadline (run's --wait).
var errNoAnswer = errors.New("did not answer")

// usageErr and redisErr classify errors for the exit status.
type (
	usageErr struct{ error }
	redisErr struct{ error }
)

func (e usageErr) Unwrap() error { return e.error }
func (e redisErr) Unwrap() error { return e.error }

// fail prints err and returns its exit status: exitUsage for a usageErr,
// exitRedis otherwise.
func (c *cli) fail(err error) int {
	c.errorf("%v", err)
	if errors.As(err, new(usageErr)) {
		return exitUsage
	}
	return exitRedis
}
