package remutexotel

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// Metric names; README.md has the table of them, with units and attributes.
const (
	MetricWaitDuration  = "remutex.lock.wait.duration"
	MetricHoldDuration  = "remutex.lock.hold.duration"
	MetricAcquisitions  = "remutex.lock.acquisitions"
	MetricRenewals      = "remutex.lock.renewals"
	MetricRenewFailures = "remutex.lock.renewal.failures"
	MetricLosses        = "remutex.lock.losses"
	MetricHeld          = "remutex.lock.held"
	MetricWaiting       = "remutex.lock.waiting"
)

// DurationBuckets are the explicit bucket boundaries, in seconds, advised
// for the two duration histograms: from half a millisecond (an uncontended
// Lock on a local Redis) to a minute. A View of the MeterProvider may
// override them.
var DurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

type instruments struct {
	wait, hold             metric.Float64Histogram
	acquisitions, renewals metric.Int64Counter
	renewFailures, losses  metric.Int64Counter
	held, waiting          metric.Int64UpDownCounter
}

func (in *instruments) init(m metric.Meter) error {
	var errs [8]error
	buckets := metric.WithExplicitBucketBoundaries(DurationBuckets...)
	in.wait, errs[0] = m.Float64Histogram(MetricWaitDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from a Lock call until it held the lock or gave up."))
	in.hold, errs[1] = m.Float64Histogram(MetricHoldDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("Time from acquiring a lock until its release or loss."))
	in.acquisitions, errs[2] = m.Int64Counter(MetricAcquisitions, metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisitions of a lock (not counting nested Locks)."))
	in.renewals, errs[3] = m.Int64Counter(MetricRenewals, metric.WithUnit("{renewal}"),
		metric.WithDescription("Renewals of a hold's lease by the watchdog."))
	in.renewFailures, errs[4] = m.Int64Counter(MetricRenewFailures, metric.WithUnit("{renewal}"),
		metric.WithDescription("Renewals that failed (Redis error or late reply) and are retried."))
	in.losses, errs[5] = m.Int64Counter(MetricLosses, metric.WithUnit("{hold}"),
		metric.WithDescription("Holds lost before they were unlocked."))
	in.held, errs[6] = m.Int64UpDownCounter(MetricHeld, metric.WithUnit("{hold}"),
		metric.WithDescription("Holds of the lock now."))
	in.waiting, errs[7] = m.Int64UpDownCounter(MetricWaiting, metric.WithUnit("{waiter}"),
		metric.WithDescription("Lock calls waiting for the lock now."))
	return errors.Join(errs[:]...)
}
