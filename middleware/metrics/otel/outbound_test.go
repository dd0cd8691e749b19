package sluiceotel_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// outboundEvents sends m an OutboundEvent of each kind, and one of no
// kind, which is ignored.
func outboundEvents(m *sluiceotel.Metrics) {
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundWaited, Rule: "partner", Duration: 20 * time.Millisecond})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundWaited, Rule: "partner", Duration: 2 * time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundGaveUp, Rule: "partner", Duration: 5 * time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundRefused, Rule: "partner", Status: 429})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundPaused, Rule: "partner", Duration: time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLowered, Rule: "partner", Units: 7})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLearned, Rule: "partner", Unit: "requests", Units: 98, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLearned, Rule: "partner", Unit: "requests", Units: 49, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundCut, Rule: "partner", Unit: "requests", Units: 48, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Rule: "ignored"})
}

func TestOutbound(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	outboundEvents(m)
	got := totals(collect(t, reader))
	want := map[string]float64{
		sluiceotel.OutboundWaits: 2, sluiceotel.OutboundGaveUp: 1, sluiceotel.OutboundUpstreamRefused: 1,
		sluiceotel.OutboundPauses: 1, sluiceotel.OutboundLoweredUnits: 7, sluiceotel.OutboundWait + "_count": 3,
		sluiceotel.OutboundLearnedLimit: 49, sluiceotel.OutboundLearnedRatio: 0.49, sluiceotel.OutboundCuts: 1,
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s = %v, want %v", name, got[name], n)
		}
	}
}
