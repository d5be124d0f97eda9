package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// machine describes where the numbers come from.
type machine struct {
	CPU        string
	Cores      int
	GOMAXPROCS int
	Go         string
	OS         string
	Kernel     string
	Redis      string
	RedisAddr  string
	LoadStart  string
	LoadEnd    string
	Modules    map[string]string // library module versions
}

func describeMachine() machine {
	m := machine{
		CPU:        cpuModel(),
		Cores:      runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go:         runtime.Version(),
		OS:         runtime.GOOS + "/" + runtime.GOARCH,
		LoadStart:  loadavg(),
		Modules:    map[string]string{},
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/remutex/remutex", "github.com/go-redsync/redsync/v4", "github.com/bsm/redislock",
				"github.com/redis/rueidis", "github.com/redis/go-redis/v9":
				v := d.Version
				if d.Replace != nil {
					v = "local (" + d.Replace.Path + ")"
				}
				m.Modules[d.Path] = v
			}
		}
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadavg returns /proc/loadavg's 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func load1() float64 {
	f := strings.Fields(loadavg())
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// awaitLoad waits until the 1-minute load average is below limit, or until
// timeout has passed.
func awaitLoad(limit float64, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		l := load1()
		if l >= 0 && l < limit {
			fmt.Fprintf(os.Stderr, "load %s: below %.2f, starting\n", loadavg(), limit)
			return
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "load %s: still not below %.2f after %v, starting anyway\n", loadavg(), limit, timeout)
			return
		}
		fmt.Fprintf(os.Stderr, "load %s: waiting for it to drop below %.2f\n", loadavg(), limit)
		time.Sleep(15 * time.Second)
	}
}
