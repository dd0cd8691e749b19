package sluiceprom_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/middleware"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// usageEvents reports one settle of each kind: more than the estimate,
// into debt; less, given back; a failed one.
func usageEvents(m *sluiceprom.Metrics) {
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 900, Charged: 800, Debt: 300})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 40, Charged: -60})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 5, Charged: 4, Err: errors.New("down")})
}

func TestUsageMetrics(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	usageEvents(m)
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_usage_settled_total{policy="chat-tokens",rule="chat"}`:  800,
		`sluice_usage_refunded_total{policy="chat-tokens",rule="chat"}`: 60,
		`sluice_usage_debt_count{policy="chat-tokens",rule="chat"}`:     1,
		`sluice_usage_debt_sum{policy="chat-tokens",rule="chat"}`:       300,
		`sluice_usage_settle_errors_total{rule="chat"}`:                 1,
	})
}
