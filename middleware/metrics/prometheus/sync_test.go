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

// syncEvents sends m one SyncEvent of each kind.
func syncEvents(m *sluiceprom.Metrics) {
	for i, k := range []middleware.SyncEventKind{middleware.SyncUnsynced, middleware.SyncLeaseGranted, middleware.SyncGaveBack, middleware.SyncDropped} {
		m.Synced(middleware.SyncEvent{Kind: k, Rule: "api", Units: int64(i + 1)})
	}
	m.Synced(middleware.SyncEvent{Kind: middleware.SyncFlushed, Calls: 2, Duration: 3 * time.Millisecond})
	m.Synced(middleware.SyncEvent{Kind: middleware.SyncFlushed, Calls: 1, Duration: time.Millisecond, Err: errors.New("redis down")})
}

func TestSynced(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	syncEvents(m)
	want := `
# HELP sluice_sync_dropped_total Units of deltas or leases of counters evicted from the local table that were dropped: the fleet's count misses them.
# TYPE sluice_sync_dropped_total counter
sluice_sync_dropped_total{rule="api"} 4
# HELP sluice_sync_flush_errors_total Runs of the syncer of lease and write_back rules with at least one failed call; their deltas stay to be pushed.
# TYPE sluice_sync_flush_errors_total counter
sluice_sync_flush_errors_total 1
# HELP sluice_sync_gave_back_total Units of leases that were not used and went back to Redis (unused budget).
# TYPE sluice_sync_gave_back_total counter
sluice_sync_gave_back_total{rule="api"} 3
# HELP sluice_sync_lease_granted_total Units leased from Redis by rules in lease mode.
# TYPE sluice_sync_lease_granted_total counter
sluice_sync_lease_granted_total{rule="api"} 2
# HELP sluice_sync_unsynced_total Units admitted in memory by rules in write_back mode, counted when admitted (they reach Redis at the next push).
# TYPE sluice_sync_unsynced_total counter
sluice_sync_unsynced_total{rule="api"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), sluiceprom.SyncDroppedTotal, sluiceprom.SyncFlushErrors,
		sluiceprom.SyncGaveBackTotal, sluiceprom.SyncLeaseGranted, sluiceprom.SyncUnsyncedTotal); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, sluiceprom.SyncFlushDuration); n != 1 {
		t.Errorf("%d flush duration series, want 1", n)
	}
}
