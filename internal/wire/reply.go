package wire

import (
	"fmt"
	"strconv"
)

// Reply codes of the acquire scripts (acquire.lua, wlock.lua, rlock.lua,
// sem_acquire.lua and the quorum's calls).
const (
	Lost    = -1 // a nested acquire found the hold gone
	Busy    = 0  // held by another owner
	Granted = 1  // the lock is the caller's
	Queued  = 2  // held by another; the caller waits in the queue
	Gone    = 3  // the caller's queue entry, known queued, is gone
)

// Replies of the release scripts (release.lua, wunlock.lua, runlock.lua,
// sem_release.lua, once_release.lua, and the uncontended release).
const (
	NotHeld = 0 // the owner holds nothing there
	Done    = 1 // released
	Handoff = 2 // freed and handed to the queue's head
)

// ParseAcquire decodes an acquire script's reply: the fence token (0 without
// fencing) when granted, else -(4*pttl + i) - 1, where i indexes Busy,
// Queued, Gone, Lost and pttl is the holder's time to live in ms.
func ParseAcquire(v interface{}) (code, val int64, err error) {
	x, err := Int64(v)
	if err != nil {
		return 0, 0, err
	}
	if x >= 0 {
		return Granted, x, nil
	}
	x = -x - 1
	return [...]int64{Busy, Queued, Gone, Lost}[x%4], x / 4, nil
}

// Int64 is an integer reply, sent as a number or as its text.
func Int64(v interface{}) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("remutex: unexpected script reply %v", v)
}
