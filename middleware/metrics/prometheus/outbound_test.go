package sluiceprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/middleware"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

func outboundEvents(m *sluiceprom.Metrics) {
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundWaited, Rule: "partner", Duration: 20 * time.Millisecond})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundWaited, Rule: "partner", Duration: 2 * time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundGaveUp, Rule: "partner", Duration: 5 * time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundRefused, Rule: "partner", Status: 429})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundPaused, Rule: "partner", Duration: time.Second})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLowered, Rule: "partner", Units: 7})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLearned, Rule: "partner", Unit: "requests", Units: 98, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLearned, Rule: "partner", Unit: "requests", Units: 49, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundCut, Rule: "partner", Unit: "requests", Units: 48, Limit: 100})
	m.Outbound(middleware.OutboundEvent{Kind: middleware.OutboundLearned, Rule: "llm", Unit: "tokens", Units: 9000, Limit: 10000})
	m.Outbound(middleware.OutboundEvent{Kind: 0, Rule: "ignored"})
}

func TestOutbound(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	outboundEvents(m)
	want := `
# HELP sluice_outbound_cuts_total Refusals of the upstream counted as evidence that the budget was too generous, each of which cut the fleet's learned fraction.
# TYPE sluice_outbound_cuts_total counter
sluice_outbound_cuts_total{rule="partner",unit="requests"} 1
# HELP sluice_outbound_gave_up_total Outgoing requests not sent because they could not fit within their deadline or the maximum wait.
# TYPE sluice_outbound_gave_up_total counter
sluice_outbound_gave_up_total{rule="partner"} 1
# HELP sluice_outbound_learned_limit The limit learned of the upstream, per window of the budget's first limit, as last changed for a key of the rule (each key's: Limiter.Learned).
# TYPE sluice_outbound_learned_limit gauge
sluice_outbound_learned_limit{rule="llm",unit="tokens"} 9000
sluice_outbound_learned_limit{rule="partner",unit="requests"} 49
# HELP sluice_outbound_learned_ratio The limit learned of the upstream over the limit in force it lowers, as last changed for a key of the rule.
# TYPE sluice_outbound_learned_ratio gauge
sluice_outbound_learned_ratio{rule="llm",unit="tokens"} 0.9
sluice_outbound_learned_ratio{rule="partner",unit="requests"} 0.49
# HELP sluice_outbound_lowered_units_total Units taken off the budget of outgoing requests to follow the upstream's lower count.
# TYPE sluice_outbound_lowered_units_total counter
sluice_outbound_lowered_units_total{rule="partner"} 7
# HELP sluice_outbound_pauses_total Pauses of outgoing requests the upstream asked for (Retry-After, or a budget spent until its reset).
# TYPE sluice_outbound_pauses_total counter
sluice_outbound_pauses_total{rule="partner"} 1
# HELP sluice_outbound_upstream_refused_total Outgoing requests the limiter admitted and the upstream refused (429, or 503 with Retry-After).
# TYPE sluice_outbound_upstream_refused_total counter
sluice_outbound_upstream_refused_total{rule="partner"} 1
# HELP sluice_outbound_waits_total Outgoing requests that waited for their turn before they were sent.
# TYPE sluice_outbound_waits_total counter
sluice_outbound_waits_total{rule="partner"} 2
`
	names := []string{sluiceprom.OutboundGaveUpTotal, sluiceprom.OutboundLoweredTotal, sluiceprom.OutboundPausesTotal,
		sluiceprom.OutboundRefusedTotal, sluiceprom.OutboundWaitsTotal, sluiceprom.OutboundLearnedLimit, sluiceprom.OutboundLearnedRatio,
		sluiceprom.OutboundCutsTotal}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_outbound_wait_seconds_count{}`: 3,
		`sluice_outbound_wait_seconds_sum{}`:   7.02,
	})
}
