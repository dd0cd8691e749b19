package sluiceotel_test

import (
	"errors"
	"testing"
	"time"

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
	got := totals(collect(t, reader))
	want := map[string]float64{sluiceotel.RegionSyncErrors: 2, sluiceotel.RegionPeerUnreachable: 1, sluiceotel.RegionDropped: 1}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s = %v, want %v", name, got[name], n)
		}
	}
	if lags := got[sluiceotel.RegionPeerLag+"_count"]; lags != 1 {
		t.Errorf("%v lags recorded, want 1", lags)
	}
}
