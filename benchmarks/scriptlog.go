package main

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// scriptLog is a go-redis hook that names the script calls (EVAL, EVALSHA)
// of the clients it is added to, in the order the server runs them: it lets
// one call (or one pipeline holding calls) at a time reach the server, and
// notes each call's script and reply once the reply is in. The server under
// callgrind dumps after every script call (see callgrind.perCall), so the
// n'th dump is the n'th call noted: that gives the instructions of each
// script by the reply it gave (the path it took), which the dumps alone
// cannot tell apart.
//
// Scripts are named by the first word of their source's first line
// ("-- acquire: ..." is acquire), learnt from the EVAL a client sends when
// the server does not have the script yet; a script only ever sent with
// EVALSHA keeps its SHA's first 8 digits.
type scriptLog struct {
	turn sync.Mutex // held by the call or pipeline on the server

	mu    sync.Mutex
	names map[string]string // SHA -> name
	calls []scriptCall      // in order
}

// scriptCall is one call: its script and the reply it gave.
type scriptCall struct{ sha, reply string }

func newScriptLog() *scriptLog { return &scriptLog{names: map[string]string{}} }

var _ redis.Hook = (*scriptLog)(nil)

func (l *scriptLog) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (l *scriptLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if scriptOf(cmd) == "" {
			return next(ctx, cmd)
		}
		l.turn.Lock()
		defer l.turn.Unlock()
		err := next(ctx, cmd)
		l.note(cmd)
		return err
	}
}

// ProcessPipelineHook takes turns only for a pipeline that holds script
// calls: go-redis sends its connection set-up as a pipeline too, while the
// call that dialled the connection holds the turn.
func (l *scriptLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool { return scriptOf(cmd) != "" }) {
			return next(ctx, cmds)
		}
		l.turn.Lock()
		defer l.turn.Unlock()
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if scriptOf(cmd) != "" {
				l.note(cmd)
			}
		}
		return err
	}
}

// scriptOf returns the SHA of a script call's script, or "" for another
// command.
func scriptOf(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	switch s, _ := args[1].(string); strings.ToLower(cmd.Name()) {
	case "evalsha", "evalsha_ro":
		return s
	case "eval", "eval_ro":
		sum := sha1.Sum([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	return ""
}

// note records a call whose reply is in, learning its script's name from an
// EVAL.
func (l *scriptLog) note(cmd redis.Cmder) {
	sha := scriptOf(cmd)
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := strings.ToLower(cmd.Name()); n == "eval" || n == "eval_ro" {
		src, _ := cmd.Args()[1].(string)
		l.names[sha] = scriptName(src, sha)
	}
	l.calls = append(l.calls, scriptCall{sha, replyOf(cmd)})
}

// scriptName is the first word of a script's first line, if that is a
// comment, else the first 8 digits of its SHA.
func scriptName(src, sha string) string {
	first, _, _ := strings.Cut(src, "\n")
	if rest, ok := strings.CutPrefix(first, "--"); ok {
		if f := strings.FieldsFunc(rest, func(r rune) bool { return r == ' ' || r == ':' || r == ',' }); len(f) > 0 {
			return f[0]
		}
	}
	return sha[:8]
}

// replyOf tells the path a script took by its reply: a number, or an array's
// first element; a larger number (a fencing token) is "n", and a negative
// one below -1 (an acquire that did not get the lock: -(4 × wait ms + code)
// - 1) is named by its code: "busy", "queued", "gone" or "lost".
func replyOf(cmd redis.Cmder) string {
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return "?"
	}
	v, err := c.Result()
	switch {
	case err == redis.Nil || err == nil && v == nil:
		return "nil"
	case err != nil:
		code, _, _ := strings.Cut(err.Error(), " ")
		return code
	}
	if a, ok := v.([]interface{}); ok {
		if len(a) == 0 {
			return "[]"
		}
		v = a[0]
	}
	if n, ok := v.(int64); ok && n >= -1 && n <= 9 {
		return fmt.Sprint(n)
	}
	if n, ok := v.(int64); ok && n < -1 {
		return [...]string{"busy", "queued", "gone", "lost"}[(-n-1)%4]
	}
	if _, ok := v.(int64); ok {
		return "n"
	}
	return fmt.Sprintf("%T", v)
}

// reset forgets the calls noted so far (not the names).
func (l *scriptLog) reset() {
	l.mu.Lock()
	l.calls = nil
	l.mu.Unlock()
}

// take returns the calls noted since reset, each as "script reply". A
// script is named once any client sent its source, maybe after a call that
// was answered NOSCRIPT.
func (l *scriptLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	labels := make([]string, len(l.calls))
	for i, c := range l.calls {
		name, ok := l.names[c.sha]
		if !ok {
			name = c.sha[:8]
		}
		labels[i] = name + " " + c.reply
	}
	l.calls = nil
	return labels
}
