package sluiceotel_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// usageEvents reports one settle of each kind: more than the estimate,
// into debt; less, given back; a failed one.
func usageEvents(m *sluiceotel.Metrics) {
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 900, Charged: 800, Debt: 300})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 40, Charged: -60})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 5, Charged: 4, Err: errors.New("down")})
}

func TestUsageInstruments(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	usageEvents(m)
	got := collect(t, reader)
	const attrs = `{policy="chat-tokens",rule="chat"}`
	want := map[string]float64{
		sluiceotel.UsageSettled + attrs:          800,
		sluiceotel.UsageRefunded + attrs:         60,
		sluiceotel.UsageDebt + "_count" + attrs:  1,
		sluiceotel.UsageDebt + "_sum" + attrs:    300,
		sluiceotel.UsageErrors + `{rule="chat"}`: 1,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}
