package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestBoundedBuffer runs the example (on REDIS_ADDR if set, else on an
// embedded miniredis): every item is consumed exactly once, the buffer never
// holds more than its capacity, both Conds were waited on, Cond.Wait freed
// the lock for another Client, and a Wait at hold count 2 was refused.
func TestBoundedBuffer(t *testing.T) {
	cfg := config{producers: 3, items: 10, consumers: 2, capacity: 2, work: 2 * time.Millisecond}
	var out strings.Builder
	res, err := run(context.Background(), &out, cfg, os.Getenv("REDIS_ADDR"))
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.producers * cfg.items
	if res.produced != n || res.consumed != n || res.duplicates != 0 {
		t.Errorf("produced %d, consumed %d, %d twice; want %d, %d, 0", res.produced, res.consumed, res.duplicates, n, n)
	}
	if res.maxLen > int64(cfg.capacity) {
		t.Errorf("the buffer held %d items, capacity %d", res.maxLen, cfg.capacity)
	}
	if res.fullWaits == 0 || res.emptyWaits == 0 {
		t.Errorf("producers waited %d times, consumers %d: want both Conds used", res.fullWaits, res.emptyWaits)
	}
	if !res.freeWhileWaiting {
		t.Error("another Client could not take the lock while every consumer was in Cond.Wait")
	}
	if !errors.Is(res.refused, errHoldCount) {
		t.Errorf("wait at hold count 2 returned %v, want errHoldCount", res.refused)
	}
}
