// Command example serves the metrics of a flash sale's locks on a
// Prometheus /metrics endpoint, through remutexotel and OpenTelemetry's
// Prometheus exporter, scrapes it once the sale is over, prints a few
// lines of the scrape, checks them against what the buyers saw, and exits
// (with status 1 if they disagree).
//
// Buyers on several remutex Clients (processes, in effect) each try to buy
// items of a small stock. An item's stock is read and written back under
// the lock "sale:<item>"; a buyer gives up waiting after -patience. The Hook
// maps every "sale:<item>" to the name "sale", so that the metrics have one
// series however many items there are.
//
// It runs on an embedded miniredis unless REDIS_ADDR names a Redis server:
//
//	go run ./example
//	REDIS_ADDR=127.0.0.1:6379 go run ./example -buyers 200
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	remutexotel "github.com/remutex/remutex/otel"
)

// config is one sale.
type config struct {
	items    int           // items on sale, each with its own lock
	stock    int           // of each item
	buyers   int           // buyers, each buying every item once if it can
	clients  int           // remutex Clients the buyers are spread over
	patience time.Duration // how long a buyer waits for an item's lock
	think    time.Duration // how long a buyer holds the lock
}

func main() {
	cfg := config{}
	flag.IntVar(&cfg.items, "items", 3, "items on sale")
	flag.IntVar(&cfg.stock, "stock", 5, "stock of each item")
	flag.IntVar(&cfg.buyers, "buyers", 20, "buyers")
	flag.IntVar(&cfg.clients, "clients", 4, "remutex Clients (processes, in effect)")
	flag.DurationVar(&cfg.patience, "patience", 50*time.Millisecond, "how long a buyer waits for a lock")
	flag.DurationVar(&cfg.think, "think", time.Millisecond, "how long a buyer holds a lock")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, os.Getenv("REDIS_ADDR"), cfg); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// run holds the sale on addr (an embedded miniredis if empty) with its
// metrics served on a loopback port, then prints a few lines of a scrape.
func run(ctx context.Context, out io.Writer, addr string, cfg config) error {
	if addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			return err
		}
		defer mr.Close()
		addr = mr.Addr()
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	hook, err := remutexotel.New(remutexotel.WithMeterProvider(mp), remutexotel.WithLockNames(func(name string) string {
		kind, _, _ := strings.Cut(name, ":")
		return kind
	}))
	if err != nil {
		return err
	}
	url, stop, err := serve(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if err != nil {
		return err
	}
	defer stop()

	res, err := sell(ctx, addr, hook, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "sold %d of %d items; buyers held a lock %d times and gave up waiting %d times\n",
		res.sold, cfg.items*cfg.stock, res.locked, res.gaveUp)
	lines, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "scrape of %s (remutex samples, no buckets):\n", url)
	for _, l := range lines {
		fmt.Fprintln(out, "  "+l)
	}
	return verdict(out, lines, res)
}

// verdict checks the scrape against what the buyers saw.
func verdict(out io.Writer, lines []string, res result) error {
	acquired := total(lines, "remutex_lock_acquisitions_total{")
	timeouts := total(lines, `remutex_lock_wait_duration_seconds_count{`, `remutex_lock_outcome="timeout"`)
	held := total(lines, "remutex_lock_held{")
	if acquired != res.locked || timeouts != res.gaveUp || held != 0 {
		fmt.Fprintf(out, "verdict:  FAIL: the scrape counts %d acquisitions, %d timeouts, %d held; want %d, %d, 0\n",
			acquired, timeouts, held, res.locked, res.gaveUp)
		return errors.New("the metrics disagree with the sale")
	}
	fmt.Fprintf(out, "verdict:  ok: the scrape counts every acquisition (%d) and timeout (%d), and nothing held\n", acquired, timeouts)
	return nil
}

// total adds up the values of the samples that start with prefix and
// contain every one of labels.
func total(lines []string, prefix string, labels ...string) int {
	n := 0
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) || !containsAll(l, labels) {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i >= 0 {
			v, _ := strconv.ParseFloat(l[i+1:], 64)
			n += int(v)
		}
	}
	return n
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// serve serves h at /metrics on a loopback port until stop, which shuts the
// server down and waits for it.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/metrics", func() {
		_ = srv.Shutdown(context.Background())
		<-done
	}, nil
}

// scrape gets url and returns its remutex samples, leaving out the
// histogram buckets.
func scrape(ctx context.Context, url string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New("scrape: " + resp.Status)
	}
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "remutex_lock_") && !strings.Contains(line, "_bucket{") {
			lines = append(lines, line)
		}
	}
	return lines, sc.Err()
}
