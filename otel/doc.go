// Package remutexotel records the locks of remutex Clients as OpenTelemetry
// metrics and spans: a hook for remutex.WithHook, on the OpenTelemetry
// metric and trace APIs only (bring your own SDK and exporters).
//
//	hook, err := remutexotel.New() // the global MeterProvider and TracerProvider
//	if err != nil { ... }
//	locks := remutex.NewClient(rdb, hook.Option())
//
// # Metrics
//
// Every metric carries remutex.lock.name (the lock's name, mapped by
// WithLockNames and capped by WithMaxLockNames, default 100 names) and
// remutex.lock.mode ("write"; "read" for the read holds of a DistRWMutex;
// a DistSemaphore's acquisitions are recorded as "write", one per Acquire
// whatever its permits).
//
//	name                           instrument      unit           more attributes
//	remutex.lock.wait.duration     histogram       s              remutex.lock.outcome: acquired | timeout | cancelled | error
//	remutex.lock.hold.duration     histogram       s              remutex.lock.end: released | release_failed | lost
//	remutex.lock.acquisitions      counter         {acquisition}  remutex.lock.handoff: free | grant
//	remutex.lock.renewals          counter         {renewal}
//	remutex.lock.renewal.failures  counter         {renewal}
//	remutex.lock.losses            counter         {hold}         remutex.lock.lost.reason: expired | denied | gone | lease_end | closed
//	remutex.lock.held              up-down counter {hold}
//	remutex.lock.waiting           up-down counter {waiter}
//
// The wait is timed from the Lock call (LockContext, TryLock...) until it
// held the lock or gave up; an uncontended Lock records its round trip. A
// timeout or cancellation is known from the context's error; "error" is
// any other (a closed Client, a permanent Redis error). A TryLock that
// finds the lock busy, a permanent error on the first call, and a context
// already done when Lock is called record nothing. The histograms advise
// DurationBuckets (0.5ms to 60s).
//
// # Spans
//
// Each acquisition and each Lock that gave up waiting makes a span
// remutex.lock.wait, from the Lock call to its end, a child of the span in
// the caller's context (LockContext's ctx; none for Lock, so a root span).
// Each acquisition whose wait span records opens a span remutex.lock.hold,
// linked to it, which ends at the release or loss: a loss adds the span
// event remutex.lock.lost (with remutex.lock.lost.reason) and sets the
// status to Error, a failed renewal adds remutex.lock.renewal.failed.
// Renewals make no spans. Spans carry the lock's own name, unmapped. A
// sampler that drops root spans (sdktrace.ParentBased(sdktrace.NeverSample()))
// keeps the spans of Lock calls outside any trace away.
//
// The spans are made when the hook hears of the event, after the fact:
// calls to Redis made while waiting are not their children.
package remutexotel
