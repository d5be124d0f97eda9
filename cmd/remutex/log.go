package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// What run reports of the remutex Client's own errors and warnings.

// lastError keeps the last error the remutex Client reported (a retried
// transient error, a lost lease), to explain a timeout.
type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) set(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}

func (l *lastError) describe() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		return ""
	}
	return "; last error: " + l.err.Error()
}

// lineHandler writes the library's warnings as one short line each:
// "remutex: renewal failed: locks=1 err=...". It leaves out the loss of the
// lock, which run reports itself together with what it does about it.
type lineHandler struct {
	w     io.Writer
	mu    *sync.Mutex
	attrs []slog.Attr
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "remutex: lock lost" {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	sep := ": "
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, "%s%s=%v", sep, a.Key, a.Value)
		sep = " "
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &lineHandler{w: h.w, mu: h.mu, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *lineHandler) WithGroup(string) slog.Handler { return h }
