package scripts

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/remutex/remutex/internal/redistest"
)

// callRe finds every redis.call or redis.pcall and what follows its
// parenthesis.
var callRe = regexp.MustCompile(`redis\.p?call\s*\(\s*(.?)`)

// nonLiteral returns the calls in src whose command is not a string
// literal, as "line N: text".
func nonLiteral(src string) []string {
	var bad []string
	for i, line := range strings.Split(src, "\n") {
		code, _, _ := strings.Cut(line, "--")
		for _, m := range callRe.FindAllStringSubmatch(code, -1) {
			if m[1] != "'" && m[1] != `"` {
				bad = append(bad, "line "+itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
	}
	return bad
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// TestCommandsLiteral: every redis.call and redis.pcall of every script
// and fragment names its command as a string literal.
func TestCommandsLiteral(t *testing.T) {
	paths := []string{}
	for _, n := range Names() {
		paths = append(paths, n+".lua")
	}
	for _, f := range Fragments() {
		paths = append(paths, "lib/"+f)
	}
	calls := 0
	for _, p := range paths {
		src, err := Raw(p)
		if err != nil {
			t.Fatal(err)
		}
		calls += len(callRe.FindAllString(src, -1))
		for _, bad := range nonLiteral(src) {
			t.Errorf("%s, %s: the command is not a literal", p, bad)
		}
	}
	if calls < 100 {
		t.Errorf("found %d calls in %d files: the pattern finds too few", calls, len(paths))
	}
}

// TestNonLiteralCaught: the check above finds what it must.
func TestNonLiteralCaught(t *testing.T) {
	for src, want := range map[string]int{
		"redis.pcall(pub, channel, msg)":                   1,
		"local n = redis.call( ARGV[1], k)":                1,
		"redis.call('get', k) redis.pcall(cmd)":            1,
		"redis.call('get', k)\nredis.pcall(\"set\", k, v)": 0,
		"-- redis.call(cmd) in a comment":                  0,
	} {
		if got := len(nonLiteral(src)); got != want {
			t.Errorf("nonLiteral(%q): got %d, want %d", src, got, want)
		}
	}
}

// TestIncludes: includes expand where they stand, every fragment serves
// some script, and a missing one is a clear error.
func TestIncludes(t *testing.T) {
	used := map[string]bool{}
	for _, n := range Names() {
		src := Source(n)
		if strings.HasPrefix(src, includeDirective) || strings.Contains(src, "\n"+includeDirective) {
			t.Errorf("%s: an include is left after expansion", n)
		}
		raw, _ := Raw(n + ".lua")
		for _, line := range strings.Split(raw, "\n") {
			if f, ok := strings.CutPrefix(line, includeDirective); ok {
				used[strings.TrimSpace(f)] = true
			}
		}
	}
	for _, f := range Fragments() {
		raw, _ := Raw("lib/" + f)
		for _, line := range strings.Split(raw, "\n") {
			if g, ok := strings.CutPrefix(line, includeDirective); ok {
				used[strings.TrimSpace(g)] = true
			}
		}
		if !strings.Contains(raw, "-- Reads:") || !strings.Contains(raw, "-- Defines:") {
			t.Errorf("lib/%s: no header stating what it reads and defines", f)
		}
	}
	for _, f := range Fragments() {
		if !used[f] {
			t.Errorf("lib/%s is included by no script", f)
		}
	}
	// seed.lua stands inside fence.lua's function, where fence.lua says.
	fence := Source("release")
	if i, j := strings.Index(fence, "local function next_fence()"), strings.Index(fence, "redis.call('time')"); i < 0 || j < i {
		t.Errorf("release: seed.lua not expanded inside next_fence")
	}
	_, err := expand("lib/missing.lua", "x.lua", 0)
	if err == nil || !strings.Contains(err.Error(), "missing.lua (included by x.lua): no such file") {
		t.Errorf("a missing include: got %v", err)
	}
}

// TestLoadOnServer: every assembled script compiles on a real server (SCRIPT
// LOAD), and its SHA is the one the server gives it.
func TestLoadOnServer(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for _, n := range Names() {
		src := Source(n)
		sha, err := rdb.ScriptLoad(ctx, src).Result()
		if err != nil {
			t.Errorf("%s: SCRIPT LOAD: %v", n, err)
			continue
		}
		if want := redis.NewScript(src).Hash(); sha != want {
			t.Errorf("%s: the server's SHA %s, want %s", n, sha, want)
		}
	}
}

// luaToken finds the words that open and close Lua blocks, after strings
// and comments are cut from a line.
var (
	luaString = regexp.MustCompile(`'[^']*'|"[^"]*"`)
	luaToken  = regexp.MustCompile(`\b(do|if|function|repeat|end|until)\b`)
)

// unbranchedFunctions returns the lines of src that define a function
// inside no if: built at each call of the script that gets that far,
// whichever branch it takes.
func unbranchedFunctions(src string) []string {
	var found []string
	var open []string // the blocks around a line, innermost last
	for i, line := range strings.Split(src, "\n") {
		code, _, _ := strings.Cut(line, "--")
		code = luaString.ReplaceAllString(code, "''")
		for _, tok := range luaToken.FindAllString(code, -1) {
			switch tok {
			case "end", "until":
				if len(open) > 0 {
					open = open[:len(open)-1]
				}
				continue
			case "function":
				branched := false
				for _, b := range open {
					branched = branched || b == "if"
				}
				if !branched {
					found = append(found, "line "+itoa(i+1)+": "+strings.TrimSpace(line))
				}
			}
			open = append(open, tok)
		}
	}
	return found
}

// TestHotPathsBuildNoFunctions: Lua builds a script's functions at every
// call that reaches their definition (about 1k instructions each, and more
// for its collector), so the scripts of a DistMutex's uncontended cycle, of
// its waiters and of its hand-off define theirs only inside the branches
// that call them (fence.lua's for a head that fences, take_hash.lua's for a
// waiter that takes the lock).
func TestHotPathsBuildNoFunctions(t *testing.T) {
	for _, n := range []string{"quick_lock", "acquire", "wake", "release", "leave"} {
		if found := unbranchedFunctions(Source(n)); len(found) > 0 {
			t.Errorf("%s defines functions outside its branches: %s", n, strings.Join(found, "; "))
		}
	}
	// The check finds what it must: queue.lua's functions, at the top of
	// rw.lua's scripts, and a function in a loop.
	if found := unbranchedFunctions(Source("rlock")); len(found) < 2 {
		t.Errorf("rlock: found %d functions outside branches, want its own and queue.lua's", len(found))
	}
	src := "if x then\n local function f() end\nend\nfor i = 1, 2 do\n local function g() end\nend\nlocal h = 'end'"
	if found := unbranchedFunctions(src); len(found) != 1 || !strings.Contains(found[0], "g()") {
		t.Errorf("unbranchedFunctions: got %v, want g alone", found)
	}
}
