package sluiceotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the instruments of a RegionStore's syncer
// (middleware.RegionEvent).
const (
	RegionPeerLag         = "sluice.region.peer.lag"
	RegionSyncErrors      = "sluice.region.sync.errors"
	RegionPeerUnreachable = "sluice.region.peer.unreachable"
	RegionDropped         = "sluice.region.dropped"
)

// regionInstruments are fed by the Observer event Region.
type regionInstruments struct {
	lag             metric.Float64Histogram
	errors, dropped metric.Int64Counter
	unreachable     metric.Int64UpDownCounter
}

func (m *Metrics) initRegion(meter metric.Meter) error {
	s := &m.region
	var errs [4]error
	s.lag, errs[0] = meter.Float64Histogram(RegionPeerLag, metric.WithUnit("s"),
		metric.WithDescription("How long a sync of this region's global counts to a peer region took: what the peer's view lags behind, on top of the sync interval."),
		metric.WithExplicitBucketBoundaries(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
	s.errors, errs[1] = meter.Int64Counter(RegionSyncErrors, metric.WithUnit("{sync}"),
		metric.WithDescription("Syncs of global counts to a peer region that failed; they are retried at the next sync."))
	s.unreachable, errs[2] = meter.Int64UpDownCounter(RegionPeerUnreachable, metric.WithUnit("{region}"),
		metric.WithDescription("Peer regions unreachable for longer than the hold time, each counted as its share of every global limit."))
	s.dropped, errs[3] = meter.Int64Counter(RegionDropped, metric.WithUnit("{counter}"),
		metric.WithDescription("Global counters not synced to peers because too many were."))
	return errors.Join(errs[:]...)
}

// Region records what the syncer of a RegionStore did. It implements
// middleware.Observer.
func (m *Metrics) Region(e middleware.RegionEvent) {
	ctx, s := context.Background(), &m.region
	peer := m.with(attribute.String("peer", e.Peer))
	switch e.Kind {
	case middleware.RegionSynced:
		s.lag.Record(ctx, e.Lag.Seconds(), peer)
	case middleware.RegionSyncFailed:
		s.errors.Add(ctx, 1, peer)
	case middleware.RegionPeerUnreachable:
		s.unreachable.Add(ctx, 1, peer)
	case middleware.RegionPeerReachable:
		s.unreachable.Add(ctx, -1, peer)
	case middleware.RegionDropped:
		s.dropped.Add(ctx, 1, m.with())
	}
}
