package sluiceotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// regionEvents sends m RegionEvents of each kind.
func regionEvents(m *sluiceotel.Metrics) {
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSynced, Peer: "eu-west-1", Lag: 80 * time.Millisecond})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("cut")})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("cut")})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerUnreachable, Peer: "ap-southeast-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerUnreachable, Peer: "eu-west-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerReachable, Peer: "eu-west-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionDropped})
}

func TestRegion(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	regionEvents(m)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{sluiceotel.RegionSyncErrors: 2, sluiceotel.RegionPeerUnreachable: 1, sluiceotel.RegionDropped: 1}
	got := map[string]int64{}
	var lags uint64
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[md.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				if md.Name == sluiceotel.RegionPeerLag {
					for _, p := range d.DataPoints {
						lags += p.Count
					}
				}
			}
		}
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s = %d, want %d", name, got[name], n)
		}
	}
	if lags != 1 {
		t.Errorf("%d lags recorded, want 1", lags)
	}
}
