package sluiceotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the instruments of rules in lease or write-back mode
// (middleware.SyncEvent).
const (
	SyncUnsynced      = "sluice.sync.unsynced"
	SyncFlushDuration = "sluice.sync.flush.duration"
	SyncFlushErrors   = "sluice.sync.flush.errors"
	SyncLeaseGranted  = "sluice.sync.lease.granted"
	SyncGaveBack      = "sluice.sync.gave_back"
	SyncDropped       = "sluice.sync.dropped"
)

// syncInstruments are fed by the Observer event Synced.
type syncInstruments struct {
	unsynced, granted, gaveBack, dropped metric.Int64Counter
	flush                                metric.Float64Histogram
	flushErrors                          metric.Int64Counter
}

func (m *Metrics) initSync(meter metric.Meter) error {
	s := &m.sync
	var errs [6]error
	s.unsynced, errs[0] = meter.Int64Counter(SyncUnsynced, metric.WithUnit("{unit}"),
		metric.WithDescription("Units admitted in memory by rules in write_back mode, counted when admitted (they reach Redis at the next push)."))
	s.granted, errs[1] = meter.Int64Counter(SyncLeaseGranted, metric.WithUnit("{unit}"),
		metric.WithDescription("Units leased from Redis by rules in lease mode."))
	s.gaveBack, errs[2] = meter.Int64Counter(SyncGaveBack, metric.WithUnit("{unit}"),
		metric.WithDescription("Units of leases that were not used and went back to Redis (unused budget)."))
	s.dropped, errs[3] = meter.Int64Counter(SyncDropped, metric.WithUnit("{unit}"),
		metric.WithDescription("Units of deltas or leases of counters evicted from the local table that were dropped: the fleet's count misses them."))
	s.flush, errs[4] = meter.Float64Histogram(SyncFlushDuration, metric.WithUnit("s"),
		metric.WithDescription("How long one run of the syncer of lease and write_back rules took (its calls to Redis, made concurrently)."),
		metric.WithExplicitBucketBoundaries(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
	s.flushErrors, errs[5] = meter.Int64Counter(SyncFlushErrors, metric.WithUnit("{run}"),
		metric.WithDescription("Runs of the syncer of lease and write_back rules with at least one failed call; their deltas stay to be pushed."))
	return errors.Join(errs[:]...)
}

// Synced records what the coordination layer of rules in lease or
// write-back mode did. It implements middleware.Observer.
func (m *Metrics) Synced(e middleware.SyncEvent) {
	ctx, s := context.Background(), &m.sync
	var c metric.Int64Counter
	switch e.Kind {
	case middleware.SyncFlushed:
		s.flush.Record(ctx, e.Duration.Seconds(), m.with())
		if e.Err != nil {
			s.flushErrors.Add(ctx, 1, m.with())
		}
		return
	case middleware.SyncUnsynced:
		c = s.unsynced
	case middleware.SyncLeaseGranted:
		c = s.granted
	case middleware.SyncGaveBack:
		c = s.gaveBack
	case middleware.SyncDropped:
		c = s.dropped
	default:
		return
	}
	c.Add(ctx, e.Units, m.with(attribute.String("rule", m.capLabel(e.Rule))))
}
