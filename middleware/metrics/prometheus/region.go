package sluiceprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the metrics of a RegionStore's syncer
// (middleware.RegionEvent).
const (
	RegionPeerLag         = "sluice_region_peer_lag_seconds"
	RegionSyncErrors      = "sluice_region_sync_errors_total"
	RegionPeerUnreachable = "sluice_region_peer_unreachable"
	RegionDroppedTotal    = "sluice_region_dropped_total"
)

// regionMetrics are fed by the Observer event Region. The peer label has
// one value per configured peer region.
type regionMetrics struct {
	lag         *prometheus.HistogramVec
	errors      *prometheus.CounterVec
	unreachable *prometheus.GaugeVec
	dropped     prometheus.Counter
}

func newRegionMetrics(cl prometheus.Labels) regionMetrics {
	return regionMetrics{
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: RegionPeerLag, ConstLabels: cl,
			Help:    "How long a sync of this region's global counts to a peer region took: what the peer's view lags behind, on top of the sync interval.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}, []string{"peer"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: RegionSyncErrors, ConstLabels: cl,
			Help: "Syncs of global counts to a peer region that failed; they are retried at the next sync."}, []string{"peer"}),
		unreachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: RegionPeerUnreachable, ConstLabels: cl,
			Help: "1 while a peer region has been unreachable for longer than the hold time and counts as its share of every global limit."}, []string{"peer"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: RegionDroppedTotal, ConstLabels: cl,
			Help: "Global counters not synced to peers because too many were."}),
	}
}

func (s *regionMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.lag, s.errors, s.unreachable, s.dropped}
}

// Region records what the syncer of a RegionStore did. It implements
// middleware.Observer.
func (m *Metrics) Region(e middleware.RegionEvent) {
	s := &m.region
	switch e.Kind {
	case middleware.RegionSynced:
		s.lag.WithLabelValues(e.Peer).Observe(e.Lag.Seconds())
	case middleware.RegionSyncFailed:
		s.errors.WithLabelValues(e.Peer).Inc()
	case middleware.RegionPeerUnreachable:
		s.unreachable.WithLabelValues(e.Peer).Set(1)
	case middleware.RegionPeerReachable:
		s.unreachable.WithLabelValues(e.Peer).Set(0)
	case middleware.RegionDropped:
		s.dropped.Inc()
	}
}
