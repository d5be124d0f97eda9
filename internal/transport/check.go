package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/wire"
)

// The oldest servers remutex supports (and is tested on): Check refuses
// older ones.
var (
	minRedis  = [2]int{6, 2}
	minValkey = [2]int{7, 2}
)

// Server is a server as Check found it: the fields of the root's
// ServerInfo, which it converts to.
type Server struct {
	Addr, Name, Version string
}

// CheckReport is what Check found: the servers, what breaks the locks, and
// what degrades them.
type CheckReport struct {
	Servers          []Server
	Broken, Degraded []error
}

// Err is the error the root's Check returns for r.
func (r *CheckReport) Err() error {
	switch {
	case len(r.Broken) > 0:
		return errors.Join(append(r.Broken, r.Degraded...)...)
	case len(r.Degraded) > 0:
		return &degradedError{errs: r.Degraded}
	}
	return nil
}

// degradedError is Check's error when all it found degrades the locks: it
// matches ErrDegraded.
type degradedError struct{ errs []error }

func (e *degradedError) Error() string        { return errors.Join(e.errs...).Error() }
func (e *degradedError) Unwrap() []error      { return e.errs }
func (e *degradedError) Is(target error) bool { return target == ErrDegraded }

// placed is err with where it happened (a server, a quorum's member),
// read with one "remutex: " in front, however many the layers.
type placed struct {
	where string
	err   error
}

func placedAt(where string, err error) error { return &placed{where: where, err: err} }

func (e *placed) Error() string {
	return "remutex: " + e.where + ": " + strings.TrimPrefix(e.err.Error(), "remutex: ")
}
func (e *placed) Unwrap() error { return e.err }

// check checks one deployment (see Client.Check; only: just the servers'
// names and versions, for Client.Servers), its permissions on keys and
// channels under prefix, as a Client of id uses them. Its conversation with Redis runs
// as a job of the node's drainer, so that the caller returns when ctx
// ends whatever go-redis does, as the lock calls do (see batcher); the job
// stops at its next step once the caller is gone.
func (n *node) Check(ctx context.Context, prefix, id string, only bool) *CheckReport {
	sharded := false
	if !only {
		sharded = n.sharded(ctx) // (a job of its own: not from within ours)
	}
	var r *CheckReport
	err := n.batch.job(ctx, func(jctx context.Context) {
		jctx, cancel := context.WithCancel(jctx)
		defer cancel()
		defer context.AfterFunc(ctx, cancel)()
		r = n.checkNow(jctx, prefix, id, only, sharded)
	})
	if err != nil {
		return &CheckReport{Broken: []error{placedAt(n.describe(), noAnswer(err))}}
	}
	return r
}

// noAnswer is the error of a check whose caller stopped waiting.
func noAnswer(err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return fmt.Errorf("no answer before the context ended: %w", err)
	}
	return err
}

// describe names the node's servers for messages.
func (n *node) describe() string {
	switch r := n.rdb.(type) {
	case *redis.Client:
		return "server " + r.Options().Addr
	case *redis.ClusterClient:
		return "cluster " + strings.Join(r.Options().Addrs, ",")
	}
	return fmt.Sprintf("%T", n.rdb)
}

// checkNow is check's conversation with Redis, on the drainer.
func (n *node) checkNow(ctx context.Context, prefix, id string, only, sharded bool) *CheckReport {
	r := &CheckReport{}
	for _, srv := range n.servers(ctx) {
		if srv.err != nil {
			r.Broken = append(r.Broken, srv.err)
			continue
		}
		info, err := n.serverInfo(ctx, srv.rdb)
		r.Servers = append(r.Servers, info)
		where := "server " + info.Addr
		if info.Name != "" {
			where += " (" + info.Name + " " + info.Version + ")"
		}
		if err == nil && !only {
			err = n.checkServer(ctx, srv.rdb, info)
		}
		if err != nil {
			r.Broken = append(r.Broken, placedAt(where, err))
		}
	}
	if len(r.Broken) > 0 || only {
		return r // no use asking about permissions
	}
	r.Broken, r.Degraded = n.checkPermissions(ctx, prefix, id, sharded)
	return r
}

// checkTarget is one Redis server of a node, or why it could not be had.
type checkTarget struct {
	rdb *redis.Client
	err error
}

// servers returns the servers a node's locks use: its one server, or every
// master of a Cluster.
func (n *node) servers(ctx context.Context) []checkTarget {
	switch r := n.rdb.(type) {
	case *redis.Client:
		return []checkTarget{{rdb: r}}
	case *redis.ClusterClient:
		var (
			mu  sync.Mutex
			out []checkTarget
		)
		err := r.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			out = append(out, checkTarget{rdb: m})
			return nil
		})
		if err != nil || len(out) == 0 {
			out = append(out, checkTarget{err: placedAt(n.describe(), n.checkErr(err))})
		}
		return out
	}
	return []checkTarget{{err: fmt.Errorf("remutex: Check: a %T is not supported", n.rdb)}}
}

// serverInfo asks a server its name and version: HELLO without arguments
// (Redis 6 and later, any user: @connection), else INFO server. A server
// that answers neither (an ACL user without INFO on a server without
// HELLO) stays unnamed. The error is the server's failure to answer, or
// that it is older than remutex supports.
func (n *node) serverInfo(ctx context.Context, rdb *redis.Client) (Server, error) {
	info := Server{Addr: rdb.Options().Addr}
	v, err := rdb.Do(ctx, "hello").Result()
	if err == nil {
		fields := helloFields(v)
		info.Name, info.Version = serverName(fields["server"]), fields["version"]
		return info, supported(info)
	}
	if !isRedisError(err) {
		return info, n.checkErr(err)
	}
	text, ierr := rdb.Info(ctx, "server").Result()
	if ierr != nil {
		if !isRedisError(ierr) {
			return info, n.checkErr(ierr)
		}
		return info, nil // neither: nothing to tell
	}
	fields := infoFields(text)
	info.Name, info.Version = serverName(fields["server_name"]), fields["redis_version"]
	if v := fields["valkey_version"]; v != "" {
		info.Version = v
	}
	return info, supported(info)
}

// isRedisError reports an error reply of the server (as opposed to no
// reply, or one that is not Redis's).
func isRedisError(err error) bool {
	return IsReply(err) && !IsProtocolError(err)
}

// helloFields decodes HELLO's reply: a map in RESP3, a flat array in RESP2.
func helloFields(v interface{}) map[string]string {
	out := map[string]string{}
	switch v := v.(type) {
	case map[interface{}]interface{}:
		for k, x := range v {
			out[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	case []interface{}:
		for i := 0; i+1 < len(v); i += 2 {
			out[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
		}
	}
	return out
}

// infoFields decodes the "key:value" lines of an INFO reply.
func infoFields(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// serverName is the name a server gives itself, as people write it ("" for
// none: a Redis before 7 has no server_name, and is Redis).
func serverName(s string) string {
	switch strings.ToLower(s) {
	case "", "redis":
		return "Redis"
	case "valkey":
		return "Valkey"
	}
	return s
}

// supported says why remutex does not support the server info names, or
// nil. Servers that are neither Redis nor Valkey are judged by the Redis
// version they give.
func supported(info Server) error {
	least, name := minRedis, "Redis"
	if info.Name == "Valkey" {
		least, name = minValkey, "Valkey"
	}
	v, ok := parseVersion(info.Version)
	if !ok || v[0] > least[0] || v[0] == least[0] && v[1] >= least[1] {
		return nil
	}
	return fmt.Errorf("%s %s is older than %s %d.%d, the oldest remutex supports (Redis %d.%d, Valkey %d.%d and later): upgrade the server",
		info.Name, info.Version, name, least[0], least[1], minRedis[0], minRedis[1], minValkey[0], minValkey[1])
}

// parseVersion reads the major and minor numbers of "7.4.1".
func parseVersion(s string) ([2]int, bool) {
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return [2]int{}, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	return [2]int{major, minor}, err1 == nil && err2 == nil
}

// checkServer loads the scripts into one server and reads its
// maxmemory-policy.
func (n *node) checkServer(ctx context.Context, rdb *redis.Client, info Server) error {
	for _, sc := range all {
		if err := ctx.Err(); err != nil {
			return noAnswer(err)
		}
		err := rdb.ScriptLoad(ctx, sc.Src.(string)).Err()
		if err != nil && !redis.HasErrorPrefix(err, "NOPERM") {
			return fmt.Errorf("SCRIPT LOAD: %w", n.checkErr(err))
		}
	}
	policy, err := rdb.ConfigGet(ctx, "maxmemory-policy").Result()
	if err != nil {
		return nil // a managed server may refuse CONFIG: nothing to tell
	}
	if p := policy["maxmemory-policy"]; strings.HasPrefix(p, "allkeys-") || strings.HasPrefix(p, "volatile-") {
		return fmt.Errorf("%w: it is %s (set noeviction)", ErrEvictionPolicy, p)
	}
	return nil
}

// checkErr is a Redis error as the lock calls would report it.
func (n *node) checkErr(err error) error {
	if err == nil {
		return errors.New("no server")
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return noAnswer(err)
	}
	return n.errs(err)
}

// checkSubscribeBound bounds check's SUBSCRIBE where its caller's context
// has no deadline: go-redis waits for its reply without a timeout.
const checkSubscribeBound = 10 * time.Second

// checkPermissions runs check.lua and a SUBSCRIBE on keys and a channel of
// prefix (as a Client of id uses them), naming what the user may not use: broken are the problems
// that keep the locks from working, degraded those they work around.
//
// A refusal is classified by the reply's error code (NOPERM) and by asking
// the server again, never by the message's text, which differs between
// servers and versions: a NOPERM for the script call, where the user may
// run scripts that touch no key, is about the keys.
func (n *node) checkPermissions(ctx context.Context, prefix, id string, sharded bool) (broken, degraded []error) {
	base := prefix + "{remutex-check." + id + "}"
	channel := base + wire.ReleasedInfix + id
	pub, count := "publish", "numsub"
	if sharded {
		pub, count = "spublish", "shardnumsub"
	}
	if n.cluster && !sharded || !n.handoff {
		// Every node relays, or a quorum's server only wakes waiters: the
		// release does not count listeners (told.lua).
		count = ""
	}
	cl := &call{s: checkScript, keys: []interface{}{base, base + ":z", base + ":s", base + ":l"}, args: []interface{}{pub, channel, count}}
	n.send(ctx, n.rdb, []*call{cl}, false, false)
	v, err := cl.cmd.Result()
	switch {
	case err != nil && redis.HasErrorPrefix(err, "NOPERM"):
		if refused := n.scriptsRefused(ctx); refused != "" {
			return []error{fmt.Errorf("remutex: the user may not run the lock scripts (%s; the ACL needs +evalsha and +eval, or +@scripting): %w", refused, err)}, nil
		}
		return []error{fmt.Errorf("remutex: the user may not use keys under the key prefix %q (the ACL needs ~%s*): %w", prefix, prefix, err)}, nil
	case err != nil:
		n.reloadAfter(err)
		return []error{placedAt("the lock scripts (EVALSHA, EVAL) failed", n.checkErr(err))}, nil
	}
	if refused := n.scriptsRefused(ctx); refused != "" {
		// EVALSHA ran the loaded script; a server that lacks it (after a
		// restart, SCRIPT FLUSH) gets it with EVAL.
		broken = append(broken, fmt.Errorf("remutex: the user may not run the lock scripts (%s; sent where the server lacks them, after a restart or SCRIPT FLUSH; the ACL needs +evalsha and +eval, or +@scripting)", refused))
	}
	reply, _ := v.([]interface{})
	if len(reply) > 0 {
		refused, _ := reply[0].([]interface{})
		for _, r := range refused {
			broken = append(broken, fmt.Errorf("remutex: the lock scripts may not run %v (under the key prefix %q)", r, prefix))
		}
	}
	if len(reply) > 1 && reply[1] != nil {
		degraded = append(degraded, fmt.Errorf("remutex: degraded: the lock scripts may not %s to %s (waiters poll instead of hearing releases; the ACL needs &%s*): %v", strings.ToUpper(pub), channel, prefix, reply[1]))
	}
	if len(reply) > 2 && reply[2] != nil {
		degraded = append(degraded, fmt.Errorf("remutex: degraded: the lock scripts may not run PUBSUB %s (a waiter whose process is gone is handed the lock, and blocks it for a claim lease; the ACL needs +pubsub|%s): %v", strings.ToUpper(count), count, reply[2]))
	}
	if err := n.checkSubscribe(ctx, channel, sharded); err != nil {
		degraded = append(degraded, fmt.Errorf("remutex: degraded: the user may not SUBSCRIBE to %s (waiters poll instead of hearing releases; the ACL needs &%s*): %w", channel, prefix, err))
	}
	return broken, degraded
}

// scriptsRefused says which script commands the user may not run ("EVAL",
// "EVALSHA", "EVALSHA and EVAL"), by the reply codes of a script that
// touches no key and of an EVALSHA of a script nobody has (NOSCRIPT where
// it may run it); "" where both are allowed.
func (n *node) scriptsRefused(ctx context.Context) string {
	var names []string
	evalsha := n.rdb.Do(ctx, "evalsha", "0000000000000000000000000000000000000000", 0).Err()
	if evalsha != nil && redis.HasErrorPrefix(evalsha, "NOPERM") {
		names = append(names, "EVALSHA")
	}
	eval := n.rdb.Do(ctx, "eval", "return 1", 0).Err()
	if eval != nil && redis.HasErrorPrefix(eval, "NOPERM") {
		names = append(names, "EVAL")
	}
	return strings.Join(names, " and ")
}

// checkSubscribe subscribes to channel on a connection of its own, and
// leaves it again.
func (n *node) checkSubscribe(ctx context.Context, channel string, sharded bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, checkSubscribeBound)
		defer cancel()
	}
	var ps *redis.PubSub
	if cc, ok := n.rdb.(*redis.ClusterClient); ok && sharded {
		ps = cc.SSubscribe(ctx, channel)
	} else {
		ps = n.rdb.Subscribe(ctx, channel)
	}
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return err
}

// check checks every server of the quorum, all at once: one that does not
// answer holds up none of the others.
func (q *quorum) Check(ctx context.Context, prefix, id string, only bool) *CheckReport {
	reports := make([]*CheckReport, len(q.nodes))
	var wg sync.WaitGroup
	for i, nd := range q.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reports[i] = nd.Check(ctx, prefix, id, only)
		}()
	}
	wg.Wait()
	all := &CheckReport{}
	for i, r := range reports {
		where := fmt.Sprintf("quorum server %d of %d", i+1, len(q.nodes))
		all.Servers = append(all.Servers, r.Servers...)
		for _, err := range r.Broken {
			all.Broken = append(all.Broken, placedAt(where, err))
		}
		for _, err := range r.Degraded {
			all.Degraded = append(all.Degraded, placedAt(where, err))
		}
	}
	return all
}
