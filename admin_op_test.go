package remutex

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestAdminErrorsNameTheirOp: the errors of Inspect and ForceUnlock are
// *LockErrors whose Op is "inspect" or "forceunlock" (as docs/api.md says),
// and whose message reads with it: `remutex: inspect "name": ...`.
func TestAdminErrorsNameTheirOp(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *testBackend) {
		c := b.client(t)
		name := lockName(t)
		if err := b.rdb(t).Set(context.Background(), c.prefix+"{"+name+"}", "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		calls := map[string]func(ctx context.Context) error{
			"inspect": func(ctx context.Context) error {
				_, err := c.Inspect(ctx, name)
				return err
			},
			"forceunlock": func(ctx context.Context) error {
				_, err := c.ForceUnlock(ctx, name)
				return err
			},
		}
		for op, call := range calls {
			for what, ctx := range map[string]context.Context{"a key of another type": context.Background(), "a cancelled context": cancelled} {
				err := call(ctx)
				var le *LockError
				switch {
				case !errors.As(err, &le):
					t.Errorf("%s with %s: got %v (%T), want a *LockError", op, what, err, err)
				case le.Op != op || le.Lock != name:
					t.Errorf("%s with %s: got Op %q, Lock %q, want %q, %q", op, what, le.Op, le.Lock, op, name)
				case !strings.HasPrefix(err.Error(), "remutex: "+op+" "+strconv.Quote(name)+": "):
					t.Errorf("%s with %s: got message %q, want it to begin with remutex: %s %q", op, what, err, op, name)
				}
			}
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for op, call := range calls {
			if err := call(context.Background()); !errors.Is(err, ErrClosed) || !strings.HasPrefix(err.Error(), "remutex: "+op+" ") {
				t.Errorf("%s after Close: got %v, want ErrClosed, read with its op", op, err)
			}
		}
	})
}
