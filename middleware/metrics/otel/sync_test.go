package sluiceotel_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// syncEvents sends m one SyncEvent of each kind.
func syncEvents(m *sluiceotel.Metrics) {
	for i, k := range []middleware.SyncEventKind{middleware.SyncUnsynced, middleware.SyncLeaseGranted, middleware.SyncGaveBack, middleware.SyncDropped} {
		m.Synced(middleware.SyncEvent{Kind: k, Rule: "api", Units: int64(i + 1)})
	}
	m.Synced(middleware.SyncEvent{Kind: middleware.SyncFlushed, Calls: 2, Duration: 3 * time.Millisecond})
	m.Synced(middleware.SyncEvent{Kind: middleware.SyncFlushed, Calls: 1, Duration: time.Millisecond, Err: errors.New("redis down")})
}

func TestSynced(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	syncEvents(m)
	got := totals(collect(t, reader))
	want := map[string]float64{sluiceotel.SyncUnsynced: 1, sluiceotel.SyncLeaseGranted: 2, sluiceotel.SyncGaveBack: 3, sluiceotel.SyncDropped: 4, sluiceotel.SyncFlushErrors: 1}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s = %v, want %v", name, got[name], n)
		}
	}
	if flushes := got[sluiceotel.SyncFlushDuration+"_count"]; flushes != 2 {
		t.Errorf("%v flush durations recorded, want 2", flushes)
	}
}
