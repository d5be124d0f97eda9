//go:build unix

package main

import (
	"context"
	"flag"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestConnectionOptions checks where the connection comes from: flags first,
// then REDIS_URL, then REDIS_ADDR, then the default.
func TestConnectionOptions(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		addr    string   // single server
		cluster []string // cluster addresses
		user    string
		pass    string
		tls     bool
		err     string
	}{
		{name: "default", addr: defaultAddr},
		{name: "REDIS_ADDR", env: map[string]string{"REDIS_ADDR": "10.1.2.3:7000"}, addr: "10.1.2.3:7000"},
		{name: "REDIS_URL wins over REDIS_ADDR", env: map[string]string{"REDIS_ADDR": "a:1", "REDIS_URL": "redis://u:p@b:2/3"}, addr: "b:2", user: "u", pass: "p"},
		{name: "rediss", env: map[string]string{"REDIS_URL": "rediss://:secret@c:3"}, addr: "c:3", pass: "secret", tls: true},
		{name: "flag wins over environment", args: []string{"--addr", "d:4"}, env: map[string]string{"REDIS_URL": "redis://b:2"}, addr: "d:4"},
		{name: "url flag", args: []string{"--url", "redis://e:5"}, addr: "e:5"},
		{name: "cluster", args: []string{"--cluster", "f:6, g:7,"}, cluster: []string{"f:6", "g:7"}},
		{name: "cluster URL", args: []string{"--cluster", "redis://h:8?addr=i:9"}, cluster: []string{"h:8", "i:9"}},
		{name: "two flags", args: []string{"--addr", "a:1", "--cluster", "b:2"}, err: "only one of"},
		{name: "bad URL", args: []string{"--url", "http://x"}, err: "--url"},
		{name: "URL as address", env: map[string]string{"REDIS_ADDR": "redis://x:1"}, err: "not HOST:PORT"},
		{name: "empty cluster", args: []string{"--cluster", ","}, err: "no address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f connFlags
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := f.check()
			var o *redis.Options
			var co *redis.ClusterOptions
			if err == nil {
				o, co, _, err = f.options(func(k string) string { return tt.env[k] })
			}
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got error %v, want one mentioning %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.cluster != nil {
				if co == nil || strings.Join(co.Addrs, ",") != strings.Join(tt.cluster, ",") {
					t.Fatalf("got cluster options %+v, want addresses %v", co, tt.cluster)
				}
				return
			}
			if o == nil || o.Addr != tt.addr || o.Username != tt.user || o.Password != tt.pass || (o.TLSConfig != nil) != tt.tls {
				t.Fatalf("got %+v, want addr %q user %q password %q TLS %v", o, tt.addr, tt.user, tt.pass, tt.tls)
			}
		})
	}
}

// TestRunPositional checks how run splits NAME [--] COMMAND.
func TestRunPositional(t *testing.T) {
	tests := []struct {
		args    []string
		name    string
		command string
		err     string
	}{
		{args: []string{"job", "--", "ls", "-l"}, name: "job", command: "ls -l"},
		{args: []string{"job", "ls", "--", "x"}, err: `"ls" between the lock name "job" and --`},
		{args: []string{"job", "ls", "x"}, name: "job", command: "ls x"},
		{args: []string{"job", "--", "--", "x"}, name: "job", command: "-- x"},
		{args: nil, err: "no lock name"},
		{args: []string{"job"}, err: "no command"},
		{args: []string{"job", "--"}, err: "no command"},
		{args: []string{"job", "--wait", "1s", "--", "ls"}, err: "flags go before NAME"},
	}
	for _, tt := range tests {
		var cfg runConfig
		err := cfg.positional(tt.args)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: got error %v, want one mentioning %q", tt.args, err, tt.err)
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.err == "" && (cfg.name != tt.name || strings.Join(cfg.command, " ") != tt.command):
			t.Errorf("%q: got name %q command %q, want %q, %q", tt.args, cfg.name, cfg.command, tt.name, tt.command)
		}
	}
}

// TestUsageErrors runs the binary with bad command lines: status 64 and a
// one-line message with one "remutex: " prefix, before any connection to
// Redis (the address given is closed).
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	closed := "127.0.0.1:1"
	tests := []struct {
		args   []string
		stderr string
	}{
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--nope", "status", "x"}, `flag provided but not defined: --nope (see "remutex help")`},
		{[]string{"status", "--nope", "x"}, `status: flag provided but not defined: --nope (see "remutex help status")`},
		{[]string{"run"}, "no lock name"},
		{[]string{"run", "x"}, "no command"},
		{[]string{"run", "--lease", "10ms", "x", "--", "true"}, "--lease 10ms"},
		{[]string{"run", "--lease", "5", "x", "--", "true"}, `a duration needs a unit, as in 5s (see "remutex help run")`},
		{[]string{"run", "--grace", "1.5", "x", "--", "true"}, "as in 1.5s"},
		{[]string{"run", "--wait", "5", "x", "--", "true"}, "as in 5s"},
		{[]string{"run", "--wait", "-1s", "x", "--", "true"}, "must not be negative"},
		{[]string{"run", "--wait", "soon", "x", "--", "true"}, "not a duration"},
		{[]string{"run", "--grace", "-1s", "x", "--", "true"}, "--grace"},
		{[]string{"run", "--fence-env", "A=B", "x", "--", "true"}, "not a variable name"},
		{[]string{"run", "--read", "--write", "x", "--", "true"}, "--read and --write exclude each other"},
		{[]string{"run", "--min-hold", "2s", "--max-hold", "1s", "x", "--", "true"}, "--min-hold 2s exceeds --max-hold 1s"}, // more in TestRunHoldUsageErrors
		{[]string{"run", "}x", "--", "true"}, `run: lock name "}x" starts with '}'`},
		{[]string{"run", "", "--", "true"}, "run: empty lock name"},
		{[]string{"run", strings.Repeat("n", 1025), "--", "true"}, "run: lock name of 1025 bytes exceeds 1024"},
		{[]string{"status", ""}, "status: empty lock name"},
		{[]string{"unlock", "--force", "}"}, "unlock: lock name \"}\" starts with '}'"},
		{[]string{"--prefix", "app{x}:", "status", "x"}, `--prefix "app{x}:": must not contain '{' or '}'`},
		{[]string{"status"}, "no lock name"},
		{[]string{"unlock", "--force"}, "exactly one lock name"},
		{[]string{"unlock", "x"}, "needs --force"},
		{[]string{"--url", "redis://a:1", "status", "--addr", "b:2", "x"}, "only one of"},
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate"`},
	}
	for _, tt := range tests {
		code, _, stderr := run(t, cliEnv("REDIS_ADDR="+closed), "", tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.stderr) {
			t.Errorf("remutex %q: exit status %d, want %d; stderr should mention %q:\n%s", tt.args, code, exitUsage, tt.stderr, stderr)
		}
		if lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); len(lines) != 1 || strings.Count(stderr, "remutex:") != 1 {
			t.Errorf("remutex %q: want one line with one \"remutex:\" prefix, got:\n%s", tt.args, stderr)
		}
	}
	// Without a command, the overview of the commands.
	if code, _, stderr := run(t, cliEnv(), ""); code != exitUsage || !strings.HasPrefix(stderr, "remutex: a distributed lock") {
		t.Errorf("remutex without arguments: exit status %d, want %d with the overview on stderr; got:\n%s", code, exitUsage, stderr)
	}
}

// TestHelp checks that -h, --help and "help COMMAND" print a command's own
// usage on stdout, with its flags, and "help" the overview.
func TestHelp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want []string // in stdout, in this order
	}{
		{[]string{"-h"}, []string{"remutex: a distributed lock", "remutex help COMMAND", "--version"}},
		{[]string{"help"}, []string{"remutex: a distributed lock", "remutex help COMMAND"}},
		{[]string{"help", "run"}, []string{"Usage: remutex run", "process group", "-grace", "-lease", "-max-hold", "-min-hold", "-read", "-wait", "-write"}},
		{[]string{"run", "-h"}, []string{"Usage: remutex run", "-lease"}},
		{[]string{"help", "status"}, []string{"Usage: remutex status", "-json"}},
		{[]string{"status", "--help"}, []string{"Usage: remutex status"}},
		{[]string{"help", "unlock"}, []string{"Usage: remutex unlock", "-force", "-yes"}},
		{[]string{"unlock", "-h"}, []string{"Usage: remutex unlock"}},
	}
	for _, tt := range tests {
		code, stdout, stderr := run(t, cliEnv(), "", tt.args...)
		if code != 0 || stderr != "" {
			t.Errorf("remutex %q: exit status %d, want 0 and nothing on stderr; stderr:\n%s", tt.args, code, stderr)
		}
		rest := stdout
		for _, w := range tt.want {
			i := strings.Index(rest, w)
			if i < 0 {
				t.Errorf("remutex %q: stdout lacks %q (or has it out of order):\n%s", tt.args, w, stdout)
				break
			}
			rest = rest[i+len(w):]
		}
	}
}

// TestVersion checks --version: the module version the binary was built
// from, or "(devel)".
func TestVersion(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := run(t, cliEnv(), "", "--version")
	if code != 0 || !regexp.MustCompile(`^remutex (\(devel\)|v\d+\.\d+\.\d+\S*)\n$`).MatchString(stdout) {
		t.Errorf("--version: exit status %d, stdout %q, want 0 and \"remutex <version>\"; stderr:\n%s", code, stdout, stderr)
	}
}

// TestRedisErrors checks status 69: an unreachable server, a wrong password,
// a key of another type under the lock's name.
func TestRedisErrors(t *testing.T) {
	t.Parallel()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := "127.0.0.1:" + strconv.Itoa(port)
	ran := filepath.Join(t.TempDir(), "ran")
	for _, args := range [][]string{
		{"run", "x", "--", "sh", "-c", `echo ran > "$RAN"`},
		{"status", "x"},
		{"unlock", "--force", "--yes", "x"},
	} {
		code, _, stderr := run(t, cliEnv("REDIS_ADDR="+closed, "RAN="+ran), "", args...)
		if code != exitRedis || !strings.Contains(stderr, "connection refused") {
			t.Errorf("remutex %q on a closed port: exit status %d, want %d; stderr:\n%s", args, code, exitRedis, stderr)
		}
	}
	if readFile(t, ran) != "" {
		t.Error("run ran its command without Redis")
	}

	srv := startRedis(t, "--requirepass", "s3cret")
	for _, tt := range []struct {
		url  string
		want int
	}{
		{"redis://:s3cret@" + srv.addr() + "/0", 0},
		{"redis://default:s3cret@" + srv.addr(), 0},
		{"redis://:wrong@" + srv.addr(), exitRedis},
		{"redis://" + srv.addr(), exitRedis},
	} {
		code, _, stderr := run(t, cliEnv("REDIS_URL="+tt.url), "", "status", "x")
		if code != tt.want {
			t.Errorf("REDIS_URL=%s: exit status %d, want %d; stderr:\n%s", tt.url, code, tt.want, stderr)
		}
	}

	shared := sharedRedis(t)
	name := lockName(t, "string")
	rdb := rdbFor(t, shared.addr())
	if err := rdb.Set(context.Background(), "remutex:{"+name+"}", "data", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := run(t, cliEnv("RAN="+ran), "", "--addr", shared.addr(), "run", name, "--", "sh", "-c", `echo ran > "$RAN"`)
	if code != exitRedis || !strings.Contains(stderr, "not a remutex lock") {
		t.Errorf("run on a string key: exit status %d, want %d; stderr:\n%s", code, exitRedis, stderr)
	}
	if readFile(t, ran) != "" {
		t.Error("run ran its command on a key of another type")
	}
}
