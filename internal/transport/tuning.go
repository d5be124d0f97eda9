package transport

import "time"

// linger is how long a lock's subscription is kept after its last local
// waiter left, to spare subscribe/unsubscribe churn under contention.
const linger = 250 * time.Millisecond

// contendedFor is how long a lock seen contended is sent the full scripts.
const contendedFor = time.Second

// UnlockTimeout bounds the calls of UnlockCtx: the root's UnlockTimeout,
// which it checks to be the same.
const UnlockTimeout = time.Second
