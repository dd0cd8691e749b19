package sluiceprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the metrics of rules in lease or write-back mode
// (middleware.SyncEvent).
const (
	SyncUnsyncedTotal = "sluice_sync_unsynced_total"
	SyncFlushDuration = "sluice_sync_flush_duration_seconds"
	SyncFlushErrors   = "sluice_sync_flush_errors_total"
	SyncLeaseGranted  = "sluice_sync_lease_granted_total"
	SyncGaveBackTotal = "sluice_sync_gave_back_total"
	SyncDroppedTotal  = "sluice_sync_dropped_total"
)

// syncMetrics are fed by the Observer event Synced.
type syncMetrics struct {
	unsynced, granted, gaveBack, dropped *prometheus.CounterVec // rule
	flush                                prometheus.Histogram
	flushErrors                          prometheus.Counter
}

func newSyncMetrics(cl prometheus.Labels) syncMetrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, []string{"rule"})
	}
	return syncMetrics{
		unsynced: counter(SyncUnsyncedTotal, "Units admitted in memory by rules in write_back mode, counted when admitted (they reach Redis at the next push)."),
		granted:  counter(SyncLeaseGranted, "Units leased from Redis by rules in lease mode."),
		gaveBack: counter(SyncGaveBackTotal, "Units of leases that were not used and went back to Redis (unused budget)."),
		dropped:  counter(SyncDroppedTotal, "Units of deltas or leases of counters evicted from the local table that were dropped: the fleet's count misses them."),
		flush: prometheus.NewHistogram(prometheus.HistogramOpts{Name: SyncFlushDuration, ConstLabels: cl,
			Help:    "How long one run of the syncer of lease and write_back rules took (its calls to Redis, made concurrently).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: SyncFlushErrors, ConstLabels: cl,
			Help: "Runs of the syncer of lease and write_back rules with at least one failed call; their deltas stay to be pushed."}),
	}
}

func (s *syncMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.unsynced, s.granted, s.gaveBack, s.dropped, s.flush, s.flushErrors}
}

// Synced counts what the coordination layer of rules in lease or
// write-back mode did. It implements middleware.Observer.
func (m *Metrics) Synced(e middleware.SyncEvent) {
	s := &m.sync
	switch e.Kind {
	case middleware.SyncFlushed:
		s.flush.Observe(e.Duration.Seconds())
		if e.Err != nil {
			s.flushErrors.Inc()
		}
		return
	case middleware.SyncUnsynced:
		s.unsynced.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(float64(e.Units))
	case middleware.SyncLeaseGranted:
		s.granted.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(float64(e.Units))
	case middleware.SyncGaveBack:
		s.gaveBack.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(float64(e.Units))
	case middleware.SyncDropped:
		s.dropped.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(float64(e.Units))
	}
}
