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
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{sluiceotel.SyncUnsynced: 1, sluiceotel.SyncLeaseGranted: 2, sluiceotel.SyncGaveBack: 3, sluiceotel.SyncDropped: 4, sluiceotel.SyncFlushErrors: 1}
	got := map[string]int64{}
	flushes := uint64(0)
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[md.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				if md.Name == sluiceotel.SyncFlushDuration {
					for _, p := range d.DataPoints {
						flushes += p.Count
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
	if flushes != 2 {
		t.Errorf("%d flush durations recorded, want 2", flushes)
	}
}
