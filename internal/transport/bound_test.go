package transport

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestUnlockBound: the pooled context of an Unlock's call on its caller's
// goroutine ends UnlockTimeout after it is taken, says so, and is reused
// only when it had not ended.
func TestUnlockBound(t *testing.T) {
	start := time.Now()
	b := takeBound()
	if d, ok := b.Deadline(); !ok || d.Before(start.Add(UnlockTimeout)) || d.After(time.Now().Add(UnlockTimeout)) {
		t.Errorf("Deadline: got (%v, %v), want UnlockTimeout from its taking", d, ok)
	}
	if b.Err() != nil || isDone(b) {
		t.Fatalf("a bound just taken has ended: Err %v", b.Err())
	}
	if b.put() {
		t.Fatal("put of a bound that had not ended: got ended")
	}

	start = time.Now()
	b = takeBound()
	select {
	case <-b.Done():
	case <-time.After(10 * UnlockTimeout):
		t.Fatal("the bound did not end")
	}
	if took := time.Since(start); took < UnlockTimeout {
		t.Errorf("the bound ended after %v, before UnlockTimeout", took)
	}
	if !errors.Is(b.Err(), context.DeadlineExceeded) {
		t.Errorf("Err of an ended bound: got %v, want DeadlineExceeded", b.Err())
	}
	if !b.put() {
		t.Error("put of an ended bound: got not ended (it would be reused with its done closed)")
	}
	if c := takeBound(); isDone(c) {
		t.Error("a bound taken after an ended one was put back has ended")
	}
}

func isDone(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return true
	default:
		return false
	}
}
