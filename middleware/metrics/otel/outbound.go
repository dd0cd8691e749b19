package sluiceotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the instruments of the outbound transport
// (middleware.OutboundEvent): outgoing requests, apart from the incoming
// ones the other instruments count.
const (
	OutboundWaits           = "sluice.outbound.waits"
	OutboundWait            = "sluice.outbound.wait"
	OutboundGaveUp          = "sluice.outbound.gave_up"
	OutboundUpstreamRefused = "sluice.outbound.upstream_refused"
	OutboundPauses          = "sluice.outbound.pauses"
	OutboundLoweredUnits    = "sluice.outbound.lowered_units"
	OutboundLearnedLimit    = "sluice.outbound.learned_limit"
	OutboundLearnedRatio    = "sluice.outbound.learned_ratio"
	OutboundCuts            = "sluice.outbound.cuts"
)

// outboundInstruments are fed by the Observer event Outbound.
type outboundInstruments struct {
	waits, gaveUp, refused, pauses, lowered, cuts metric.Int64Counter
	wait                                          metric.Float64Histogram
	learned                                       metric.Int64Gauge
	ratio                                         metric.Float64Gauge
}

func (m *Metrics) initOutbound(meter metric.Meter) error {
	s := &m.outbound
	var errs [9]error
	s.waits, errs[0] = meter.Int64Counter(OutboundWaits, metric.WithUnit("{request}"),
		metric.WithDescription("Outgoing requests that waited for their turn before they were sent."))
	s.gaveUp, errs[1] = meter.Int64Counter(OutboundGaveUp, metric.WithUnit("{request}"),
		metric.WithDescription("Outgoing requests not sent because they could not fit within their deadline or the maximum wait."))
	s.refused, errs[2] = meter.Int64Counter(OutboundUpstreamRefused, metric.WithUnit("{request}"),
		metric.WithDescription("Outgoing requests the limiter admitted and the upstream refused (429, or 503 with Retry-After)."))
	s.pauses, errs[3] = meter.Int64Counter(OutboundPauses, metric.WithUnit("{pause}"),
		metric.WithDescription("Pauses of outgoing requests the upstream asked for (Retry-After, or a budget spent until its reset)."))
	s.lowered, errs[4] = meter.Int64Counter(OutboundLoweredUnits, metric.WithUnit("{unit}"),
		metric.WithDescription("Units taken off the budget of outgoing requests to follow the upstream's lower count."))
	s.wait, errs[5] = meter.Float64Histogram(OutboundWait, metric.WithUnit("s"),
		metric.WithDescription("How long outgoing requests waited for their turn, those sent and those that gave up."),
		metric.WithExplicitBucketBoundaries(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
	s.learned, errs[6] = meter.Int64Gauge(OutboundLearnedLimit, metric.WithUnit("{unit}"),
		metric.WithDescription("The limit learned of the upstream, per window of the budget's first limit, as last changed for a key of the rule (each key's: Limiter.Learned)."))
	s.ratio, errs[7] = meter.Float64Gauge(OutboundLearnedRatio, metric.WithUnit("1"),
		metric.WithDescription("The limit learned of the upstream over the limit in force it lowers, as last changed for a key of the rule."))
	s.cuts, errs[8] = meter.Int64Counter(OutboundCuts, metric.WithUnit("{cut}"),
		metric.WithDescription("Refusals of the upstream counted as evidence that the budget was too generous, each of which cut the fleet's learned fraction."))
	return errors.Join(errs[:]...)
}

// Outbound records what the outbound transport did. It implements
// middleware.Observer.
func (m *Metrics) Outbound(e middleware.OutboundEvent) {
	ctx, s := context.Background(), &m.outbound
	var c metric.Int64Counter
	n := int64(1)
	switch e.Kind {
	case middleware.OutboundWaited:
		s.wait.Record(ctx, e.Duration.Seconds(), m.with())
		c = s.waits
	case middleware.OutboundGaveUp:
		s.wait.Record(ctx, e.Duration.Seconds(), m.with())
		c = s.gaveUp
	case middleware.OutboundRefused:
		c = s.refused
	case middleware.OutboundPaused:
		c = s.pauses
	case middleware.OutboundLowered:
		c, n = s.lowered, int64(e.Units)
	case middleware.OutboundLearned:
		attrs := m.with(attribute.String("rule", m.capLabel(e.Rule)), attribute.String("unit", e.Unit))
		s.learned.Record(ctx, int64(e.Units), attrs)
		if e.Limit > 0 {
			s.ratio.Record(ctx, float64(e.Units)/float64(e.Limit), attrs)
		}
		return
	case middleware.OutboundCut:
		s.cuts.Add(ctx, 1, m.with(attribute.String("rule", m.capLabel(e.Rule)), attribute.String("unit", e.Unit)))
		return
	default:
		return
	}
	c.Add(ctx, n, m.with(attribute.String("rule", m.capLabel(e.Rule))))
}
