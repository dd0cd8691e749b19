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
	OutboundLearnedLimit = "sluice_outbound_learned_limit"
	OutboundLearnedRatio = "sluice_outbound_learned_ratio"
	OutboundCutsTotal    = "sluice_outbound_cuts_total"
)

// outboundMetrics are fed by the Observer event Outbound.
type outboundMetrics struct {
	waits, gaveUp, refused, pauses, lowered *prometheus.CounterVec // rule
	wait                                    prometheus.Histogram
	learned, ratio                          *prometheus.GaugeVec   // rule, unit
	cuts                                    *prometheus.CounterVec // rule, unit
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
		learned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: OutboundLearnedLimit, ConstLabels: cl,
			Help: "The limit learned of the upstream, per window of the budget's first limit, as last changed for a key of the rule (each key's: Limiter.Learned)."}, []string{"rule", "unit"}),
		ratio: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: OutboundLearnedRatio, ConstLabels: cl,
			Help: "The limit learned of the upstream over the limit in force it lowers, as last changed for a key of the rule."}, []string{"rule", "unit"}),
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: OutboundCutsTotal, ConstLabels: cl,
			Help: "Refusals of the upstream counted as evidence that the budget was too generous, each of which cut the fleet's learned fraction."}, []string{"rule", "unit"}),
	}
}

func (s *outboundMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.waits, s.gaveUp, s.refused, s.pauses, s.lowered, s.wait, s.learned, s.ratio, s.cuts}
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
	case middleware.OutboundLearned:
		rule := m.capacity.label(e.Rule, m.max)
		s.learned.WithLabelValues(rule, e.Unit).Set(float64(e.Units))
		if e.Limit > 0 {
			s.ratio.WithLabelValues(rule, e.Unit).Set(float64(e.Units) / float64(e.Limit))
		}
		return
	case middleware.OutboundCut:
		s.cuts.WithLabelValues(m.capacity.label(e.Rule, m.max), e.Unit).Inc()
		return
	default:
		return
	}
	c.WithLabelValues(m.capacity.label(e.Rule, m.max)).Add(n)
}
