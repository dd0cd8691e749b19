package sluiceprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the metrics of the outbound transport
// (middleware.OutboundEvent): outgoing requests, apart from the incoming
// ones the other metrics count.
const (
	OutboundWaitsTotal   = "sluice_outbound_waits_total"
	OutboundWaitSeconds  = "sluice_outbound_wait_seconds"
	OutboundGaveUpTotal  = "sluice_outbound_gave_up_total"
	OutboundRefusedTotal = "sluice_outbound_upstream_refused_total"
	OutboundPausesTotal  = "sluice_outbound_pauses_total"
	OutboundLoweredTotal = "sluice_outbound_lowered_units_total"
)

// outboundMetrics are fed by the Observer event Outbound.
type outboundMetrics struct {
	waits, gaveUp, refused, pauses, lowered *prometheus.CounterVec // rule
	wait                                    prometheus.Histogram
}

func newOutboundMetrics(cl prometheus.Labels) outboundMetrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, []string{"rule"})
	}
	return outboundMetrics{
		waits:   counter(OutboundWaitsTotal, "Outgoing requests that waited for their turn before they were sent."),
		gaveUp:  counter(OutboundGaveUpTotal, "Outgoing requests not sent because they could not fit within their deadline or the maximum wait."),
		refused: counter(OutboundRefusedTotal, "Outgoing requests the limiter admitted and the upstream refused (429, or 503 with Retry-After)."),
		pauses:  counter(OutboundPausesTotal, "Pauses of outgoing requests the upstream asked for (Retry-After, or a budget spent until its reset)."),
		lowered: counter(OutboundLoweredTotal, "Units taken off the budget of outgoing requests to follow the upstream's lower count."),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{Name: OutboundWaitSeconds, ConstLabels: cl,
			Help:    "How long outgoing requests waited for their turn, those sent and those that gave up.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}),
	}
}

func (s *outboundMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.waits, s.gaveUp, s.refused, s.pauses, s.lowered, s.wait}
}

// Outbound counts what the outbound transport did. It implements
// middleware.Observer.
func (m *Metrics) Outbound(e middleware.OutboundEvent) {
	s := &m.outbound
	var c *prometheus.CounterVec
	n := 1.0
	switch e.Kind {
	case middleware.OutboundWaited:
		s.wait.Observe(e.Duration.Seconds())
		c = s.waits
	case middleware.OutboundGaveUp:
		s.wait.Observe(e.Duration.Seconds())
		c = s.gaveUp
	case middleware.OutboundRefused:
		c = s.refused
	case middleware.OutboundPaused:
		c = s.pauses
	case middleware.OutboundLowered:
		c, n = s.lowered, float64(e.Units)
	default:
		return
	}
	c.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(n)
}
