package sluiceprom_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/middleware"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// regionEvents sends m RegionEvents of each kind.
func regionEvents(m *sluiceprom.Metrics) {
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSynced, Peer: "eu-west-1", Lag: 80 * time.Millisecond, Counters: 3})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("cut")})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionSyncFailed, Peer: "ap-southeast-1", Err: errors.New("cut")})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerUnreachable, Peer: "ap-southeast-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerUnreachable, Peer: "eu-west-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionPeerReachable, Peer: "eu-west-1"})
	m.Region(middleware.RegionEvent{Kind: middleware.RegionDropped})
}

func TestRegion(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	regionEvents(m)
	want := `
# HELP sluice_region_dropped_total Global counters not synced to peers because too many were.
# TYPE sluice_region_dropped_total counter
sluice_region_dropped_total 1
# HELP sluice_region_peer_unreachable 1 while a peer region has been unreachable for longer than the hold time and counts as its share of every global limit.
# TYPE sluice_region_peer_unreachable gauge
sluice_region_peer_unreachable{peer="ap-southeast-1"} 1
sluice_region_peer_unreachable{peer="eu-west-1"} 0
# HELP sluice_region_sync_errors_total Syncs of global counts to a peer region that failed; they are retried at the next sync.
# TYPE sluice_region_sync_errors_total counter
sluice_region_sync_errors_total{peer="ap-southeast-1"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), sluiceprom.RegionDroppedTotal, sluiceprom.RegionPeerUnreachable, sluiceprom.RegionSyncErrors); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, sluiceprom.RegionPeerLag); n != 1 {
		t.Errorf("%d peer lag series, want 1", n)
	}
}
