// Command httpaccount serves money transfers over HTTP and guards each account
// with a remutex.DistMutex of its own, taken with LockContext and the
// request's context.
//
// Two instances of the service (two httptest servers, each with its own
// remutex Client and connection pool: two processes behind a load balancer)
// handle POST /transfer?from=A&to=B&amount=N. The handler locks both accounts,
// always in the same (sorted) order so that two opposite transfers cannot
// deadlock, reads both balances, pauses for a moment as real work would, and
// writes them back. Many transfers run at once; afterwards the balances are
// exactly what the accepted transfers make them, and no money appeared or
// vanished. The same load without the locks shows what they prevent.
//
// A request waits for its locks only as long as its context lives: the
// client's, cut to the wait the request asks for (?wait=, default 2s). When
// that ends first the handler answers 503 Service Unavailable with
// Retry-After, and leaves nothing behind: LockContext removes its waiter, and
// the account it had already locked is unlocked. Insufficient funds are 409
// Conflict.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./examples/httpaccount
//	go run ./examples/httpaccount -transfers 1000 -clients 32
//
// It exits with status 1 if the locked balances are inconsistent, or the busy
// request was not answered 503 or left something behind.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex"
)

// config is one run.
type config struct {
	accounts  int           // accounts, each starting with `opening`
	opening   int           // opening balance
	transfers int           // transfers to send
	clients   int           // concurrent HTTP clients
	gap       time.Duration // between reading the balances and writing them
}

var accountNames = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}

func main() {
	var cfg config
	flag.IntVar(&cfg.accounts, "accounts", 4, fmt.Sprintf("accounts (2 to %d)", len(accountNames)))
	flag.IntVar(&cfg.opening, "opening", 1000, "opening balance of each account")
	flag.IntVar(&cfg.transfers, "transfers", 300, "transfers to send")
	flag.IntVar(&cfg.clients, "clients", 16, "concurrent HTTP clients")
	flag.DurationVar(&cfg.gap, "gap", time.Millisecond, "pause between reading the balances and writing them")
	flag.Parse()
	if cfg.accounts < 2 || cfg.accounts > len(accountNames) || cfg.opening < 1 || cfg.transfers < 1 || cfg.clients < 1 || cfg.gap < 0 {
		fmt.Fprintf(os.Stderr, "httpaccount: need 2 ≤ -accounts ≤ %d, -opening ≥ 1, -transfers ≥ 1, -clients ≥ 1, -gap ≥ 0\n", len(accountNames))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := run(ctx, os.Stdout, cfg, os.Getenv("REDIS_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "httpaccount:", err)
		os.Exit(1)
	}
	if !res.ok() {
		os.Exit(1)
	}
}

// results is what a run found.
type results struct {
	locked, unlocked load
	busy             busyCheck
}

func (r results) ok() bool { return r.locked.consistent() && r.busy.ok() }

// load is the outcome of one batch of concurrent transfers.
type load struct {
	status   map[int]int    // HTTP status -> count
	balances map[string]int // afterwards, in Redis
	expected map[string]int // opening balances plus the accepted transfers
	total    int            // the sum of balances
	opening  int            // the sum of opening balances
	elapsed  time.Duration
}

// consistent reports whether every balance is what the accepted transfers
// make it (so no money appeared or vanished) and none is negative.
func (l load) consistent() bool {
	if l.total != l.opening {
		return false
	}
	for a, want := range l.expected {
		if l.balances[a] != want || l.balances[a] < 0 {
			return false
		}
	}
	return true
}

// busyCheck is the request that timed out while waiting for a lock.
type busyCheck struct {
	status    int           // its HTTP status
	body      string        // its response
	took      time.Duration // until the response
	leftovers []string      // what it left in Redis: none, if all went well
}

func (b busyCheck) ok() bool {
	return b.status == http.StatusServiceUnavailable && len(b.leftovers) == 0
}

// run starts the services on the Redis at addr (an embedded miniredis if
// empty), sends the transfers, prints what happened to out and returns it.
func run(ctx context.Context, out io.Writer, cfg config, addr string) (results, error) {
	where := addr
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return results{}, err
		}
		defer mr.Close()
		addr, where = mr.Addr(), "embedded miniredis (set REDIS_ADDR to use a Redis server)"
	}
	fmt.Fprintf(out, "httpaccount: %d accounts × %d, 2 service instances (one Client each), %d transfers from %d HTTP clients\n",
		cfg.accounts, cfg.opening, cfg.transfers, cfg.clients)
	fmt.Fprintf(out, "redis:       %s\n", where)

	var res results
	var err error
	if res.locked, err = transferLoad(ctx, addr, cfg, true); err != nil {
		return results{}, fmt.Errorf("with locks: %w", err)
	}
	fmt.Fprintf(out, "with locks:    %s\n", res.locked.describe(cfg))
	if res.unlocked, err = transferLoad(ctx, addr, cfg, false); err != nil {
		return results{}, fmt.Errorf("without locks: %w", err)
	}
	fmt.Fprintf(out, "without locks: %s\n", res.unlocked.describe(cfg))
	if res.busy, err = busyAccount(ctx, addr, cfg); err != nil {
		return results{}, fmt.Errorf("busy account: %w", err)
	}
	b := res.busy
	fmt.Fprintf(out, "busy account:  an auditor holds carol's lock; a transfer alice→carol allowed to wait 100ms got\n")
	fmt.Fprintf(out, "               %d %s after %v: %s\n", b.status, http.StatusText(b.status), b.took.Round(time.Millisecond), b.body)
	if len(b.leftovers) == 0 {
		fmt.Fprintf(out, "               left behind: nothing (alice's lock free, carol's held by the auditor alone, no waiter queued)\n")
	} else {
		fmt.Fprintf(out, "               left behind: %s\n", strings.Join(b.leftovers, "; "))
	}
	switch {
	case !res.ok():
		fmt.Fprintln(out, "verdict:       FAIL: want consistent balances with the locks, and a clean 503 for the busy account")
	case res.unlocked.consistent():
		fmt.Fprintln(out, "verdict:       ok: balances consistent with the locks (without them this run got lucky; try a larger -gap)")
	default:
		fmt.Fprintln(out, "verdict:       ok: with the locks every balance is exact; without them money appeared or vanished")
	}
	return res, nil
}

func (l load) describe(cfg config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d transferred (200), %d refused for lack of funds (409), %d busy (503) in %v\n",
		l.status[http.StatusOK], l.status[http.StatusConflict], l.status[http.StatusServiceUnavailable], l.elapsed.Round(time.Millisecond))
	names := make([]string, 0, len(l.balances))
	for a := range l.balances {
		names = append(names, a)
	}
	sort.Strings(names)
	b.WriteString("               balances")
	for _, a := range names {
		fmt.Fprintf(&b, " %s %d", a, l.balances[a])
	}
	fmt.Fprintf(&b, " = %d (opened with %d)", l.total, l.opening)
	differ := 0
	for a, want := range l.expected {
		if l.balances[a] != want {
			differ++
		}
	}
	if differ == 0 {
		b.WriteString("; every balance matches the accepted transfers")
	} else {
		fmt.Fprintf(&b, "; %d of %d balances differ from the accepted transfers", differ, len(l.expected))
	}
	return b.String()
}

// bank is one run's accounts in Redis.
type bank struct {
	run      string
	accounts []string
}

func newBank(cfg config) bank {
	var id [6]byte
	_, _ = rand.Read(id[:])
	return bank{run: "bank:" + hex.EncodeToString(id[:]), accounts: accountNames[:cfg.accounts]}
}

func (b bank) balanceKey(account string) string { return b.run + ":balance:" + account }
func (b bank) lockName(account string) string   { return b.run + ":account:" + account }

func (b bank) open(ctx context.Context, rdb *redis.Client, balance int) error {
	for _, a := range b.accounts {
		if err := rdb.Set(ctx, b.balanceKey(a), balance, time.Hour).Err(); err != nil {
			return err
		}
	}
	return nil
}

// cleanup removes the run's balances and lock keys.
func (b bank) cleanup(ctx context.Context, rdb *redis.Client) {
	for _, a := range b.accounts {
		rdb.Del(ctx, b.balanceKey(a), remutex.DefaultKeyPrefix+"{"+b.lockName(a)+"}")
	}
}

func (b bank) balances(ctx context.Context, rdb *redis.Client) (map[string]int, error) {
	m := map[string]int{}
	for _, a := range b.accounts {
		n, err := rdb.Get(ctx, b.balanceKey(a)).Int()
		if err != nil {
			return nil, err
		}
		m[a] = n
	}
	return m, nil
}

// service is one instance of the transfer service: one process.
type service struct {
	bank  bank
	rdb   *redis.Client
	locks *remutex.Client // nil: no locking
	gap   time.Duration
}

// errBusy means an account's lock could not be had within the request's wait.
var errBusy = errors.New("account busy")

// errFunds means the source account cannot pay.
var errFunds = errors.New("insufficient funds")

// ServeHTTP handles POST /transfer?from=A&to=B&amount=N[&wait=D].
func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/transfer" {
		http.Error(w, "POST /transfer?from=A&to=B&amount=N", http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	from, to := q.Get("from"), q.Get("to")
	amount, err := strconv.Atoi(q.Get("amount"))
	if err != nil || amount <= 0 || from == to || !s.bank.has(from) || !s.bank.has(to) {
		http.Error(w, "want two different accounts and an amount > 0", http.StatusBadRequest)
		return
	}
	wait := 2 * time.Second
	if d, err := time.ParseDuration(q.Get("wait")); err == nil && d > 0 && d < wait {
		wait = d
	}
	// The locks are waited for only as long as the request lives: the
	// client's context (it ends when the client goes away), cut to wait.
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()

	switch err := s.transfer(ctx, from, to, amount); {
	case err == nil:
		fmt.Fprintf(w, "moved %d from %s to %s\n", amount, from, to)
	case errors.Is(err, errFunds):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, errBusy):
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (b bank) has(account string) bool {
	for _, a := range b.accounts {
		if a == account {
			return true
		}
	}
	return false
}

// transfer moves amount between the accounts holding both their locks.
func (s *service) transfer(ctx context.Context, from, to string, amount int) error {
	if s.locks != nil {
		// Always lock in the same order: two opposite transfers locking in
		// opposite orders would each hold one lock and wait for the other.
		first, second := from, to
		if second < first {
			first, second = second, first
		}
		for _, account := range []string{first, second} {
			m := s.locks.NewMutex(s.bank.lockName(account))
			if err := m.LockContext(ctx); err != nil {
				if ctx.Err() != nil {
					// Gave up waiting: LockContext left nothing behind, and
					// the deferred Unlock frees the first account.
					return fmt.Errorf("%w: %v", errBusy, err)
				}
				return err
			}
			// Unlock without the request's context: a release must not be
			// cut short because the client went away.
			defer func() { _ = m.UnlockContext(context.WithoutCancel(ctx)) }()
		}
	}
	bal, err := s.rdb.MGet(ctx, s.bank.balanceKey(from), s.bank.balanceKey(to)).Result()
	if err != nil {
		return err
	}
	fromBal, err1 := strconv.Atoi(fmt.Sprint(bal[0]))
	toBal, err2 := strconv.Atoi(fmt.Sprint(bal[1]))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	if fromBal < amount {
		return fmt.Errorf("%w: %s has %d, needs %d", errFunds, from, fromBal, amount)
	}
	time.Sleep(s.gap) // a fraud check, a ledger call: the window other requests race in
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, s.bank.balanceKey(from), fromBal-amount, time.Hour)
		p.Set(ctx, s.bank.balanceKey(to), toBal+amount, time.Hour)
		return nil
	})
	return err
}

// instances starts n service instances, each with its own pool and (if
// locked) remutex Client, and returns their URLs and a function that stops
// them.
func instances(addr string, b bank, gap time.Duration, locked bool, n int) (urls []string, stop func()) {
	var stops []func()
	for range n {
		s := &service{bank: b, rdb: redis.NewClient(&redis.Options{Addr: addr}), gap: gap}
		if locked {
			s.locks = remutex.NewClient(s.rdb)
		}
		ts := httptest.NewServer(s)
		urls = append(urls, ts.URL)
		stops = append(stops, func() {
			ts.Close() // waits for the requests in flight
			if s.locks != nil {
				_ = s.locks.Close()
			}
			_ = s.rdb.Close()
		})
	}
	return urls, func() {
		for _, f := range stops {
			f()
		}
	}
}

// transferLoad sends cfg.transfers random transfers from cfg.clients
// concurrent clients to two instances, and checks the balances after.
func transferLoad(ctx context.Context, addr string, cfg config, locked bool) (load, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	b := newBank(cfg)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := b.open(ctx, admin, cfg.opening); err != nil {
		return load{}, err
	}
	defer b.cleanup(context.WithoutCancel(ctx), admin)
	urls, stop := instances(addr, b, cfg.gap, locked, 2)
	defer stop()

	start := time.Now()
	status, accepted, err := sendAll(ctx, urls, randomTransfers(b, cfg), cfg.clients)
	if err != nil {
		return load{}, err
	}
	l := load{status: status, elapsed: time.Since(start), expected: map[string]int{}}
	if n := status[http.StatusInternalServerError]; n > 0 {
		return load{}, fmt.Errorf("%d requests failed with 500", n)
	}
	for _, a := range b.accounts {
		l.expected[a] = cfg.opening
		l.opening += cfg.opening
	}
	for _, t := range accepted {
		l.expected[t.from] -= t.amount
		l.expected[t.to] += t.amount
	}
	if l.balances, err = b.balances(ctx, admin); err != nil {
		return load{}, err
	}
	for _, n := range l.balances {
		l.total += n
	}
	return l, nil
}

// transfer is one request of the load.
type transfer struct {
	from, to string
	amount   int
}

// randomTransfers returns cfg.transfers transfers between random accounts of
// b, the same every run.
func randomTransfers(b bank, cfg config) []transfer {
	rng := mrand.New(mrand.NewPCG(1, 2))
	todo := make([]transfer, cfg.transfers)
	for i := range todo {
		from := rng.IntN(len(b.accounts))
		to := (from + 1 + rng.IntN(len(b.accounts)-1)) % len(b.accounts)
		todo[i] = transfer{b.accounts[from], b.accounts[to], 1 + rng.IntN(cfg.opening/4+1)}
	}
	return todo
}

// sendAll posts every transfer of todo from clients concurrent clients, each
// sending to the instances at urls in turn, and returns how many got each
// status and the transfers that were accepted.
func sendAll(ctx context.Context, urls []string, todo []transfer, clients int) (map[int]int, []transfer, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	var (
		next     atomic.Int64
		mu       sync.Mutex
		status   = map[int]int{}
		accepted []transfer
		firstErr error
		wg       sync.WaitGroup
	)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(todo) {
					return
				}
				t := todo[i]
				code, _, err := post(ctx, client, urls[(c+i)%len(urls)], t.from, t.to, t.amount, 0)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				status[code]++
				if code == http.StatusOK {
					accepted = append(accepted, t)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return status, accepted, firstErr
}

// post sends one transfer and returns the status and body.
func post(ctx context.Context, client *http.Client, base, from, to string, amount int, wait time.Duration) (int, string, error) {
	q := url.Values{"from": {from}, "to": {to}, "amount": {strconv.Itoa(amount)}}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/transfer?"+q.Encode(), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// busyAccount has an auditor hold carol's lock while a transfer alice→carol
// that may wait 100ms comes in: it gets 503, and leaves no trace in Redis.
func busyAccount(ctx context.Context, addr string, cfg config) (busyCheck, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cfg.accounts = max(cfg.accounts, 3)
	b := newBank(cfg)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := b.open(ctx, admin, cfg.opening); err != nil {
		return busyCheck{}, err
	}
	defer b.cleanup(context.WithoutCancel(ctx), admin)
	urls, stop := instances(addr, b, cfg.gap, true, 1)
	defer stop()

	// The auditor: another process (its own Client) holding carol's lock.
	auditorRdb := redis.NewClient(&redis.Options{Addr: addr})
	defer auditorRdb.Close()
	auditor := remutex.NewClient(auditorRdb)
	defer auditor.Close()
	audit := auditor.NewMutex(b.lockName("carol"))
	if err := audit.LockContext(ctx); err != nil {
		return busyCheck{}, err
	}
	defer func() { _ = audit.UnlockContext(context.WithoutCancel(ctx)) }()
	carol := remutex.DefaultKeyPrefix + "{" + b.lockName("carol") + "}"
	alice := remutex.DefaultKeyPrefix + "{" + b.lockName("alice") + "}"
	holderBefore, err := admin.HKeys(ctx, carol).Result()
	if err != nil {
		return busyCheck{}, err
	}

	client := &http.Client{}
	defer client.CloseIdleConnections()
	start := time.Now()
	code, body, err := post(ctx, client, urls[0], "alice", "carol", 10, 100*time.Millisecond)
	if err != nil {
		return busyCheck{}, err
	}
	bc := busyCheck{status: code, body: body, took: time.Since(start)}

	// What is left, while the auditor still holds carol's lock.
	if n, err := admin.Exists(ctx, alice).Result(); err != nil || n != 0 {
		bc.leftovers = append(bc.leftovers, fmt.Sprintf("alice's lock still exists (%v)", err))
	}
	if holder, err := admin.HKeys(ctx, carol).Result(); err != nil || strings.Join(holder, ",") != strings.Join(holderBefore, ",") {
		bc.leftovers = append(bc.leftovers, fmt.Sprintf("carol's lock holders changed: %v, was %v (%v)", holder, holderBefore, err))
	}
	if n, err := admin.LLen(ctx, carol+":waiting").Result(); err != nil || n != 0 {
		bc.leftovers = append(bc.leftovers, fmt.Sprintf("%d waiters queued for carol's lock (%v)", n, err))
	}
	if bal, err := b.balances(ctx, admin); err != nil || bal["alice"] != cfg.opening || bal["carol"] != cfg.opening {
		bc.leftovers = append(bc.leftovers, fmt.Sprintf("balances changed: %v (%v)", bal, err))
	}
	return bc, nil
}
