package sluiceotel

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the instruments of usage limits (middleware.Usage).
const (
	UsageSettled  = "sluice.usage.settled"
	UsageRefunded = "sluice.usage.refunded"
	UsageDebt     = "sluice.usage.debt"
	UsageErrors   = "sluice.usage.settle_errors"
)

// usageInstruments count what settles charged and gave back, and the
// debts they left, fed by the Observer event Settled.
type usageInstruments struct {
	settled, refunded metric.Int64Counter
	debt              metric.Int64Histogram
	errors            metric.Int64Counter
}

func (m *Metrics) initUsage(meter metric.Meter) error {
	u := &m.usage
	var errs [4]error
	u.settled, errs[0] = meter.Int64Counter(UsageSettled, metric.WithUnit("{unit}"),
		metric.WithDescription("Units of usage charged after the fact, beyond requests' estimates, by rule and usage limit."))
	u.refunded, errs[1] = meter.Int64Counter(UsageRefunded, metric.WithUnit("{unit}"),
		metric.WithDescription("Units of requests' estimates given back when they used less, by rule and usage limit."))
	u.debt, errs[2] = meter.Int64Histogram(UsageDebt, metric.WithUnit("{unit}"),
		metric.WithDescription("Debt a settle left on a usage limit, in units past the limit, recorded at each settle that took a client's counter past it."),
		metric.WithExplicitBucketBoundaries(1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8))
	u.errors, errs[3] = meter.Int64Counter(UsageErrors, metric.WithUnit("{settle}"),
		metric.WithDescription("Settles of usage that the store failed to count, by rule."))
	return errors.Join(errs[:]...)
}

// Settled adds the units a settle charged to sluice.usage.settled, or gave
// back to sluice.usage.refunded, records the debt it left in
// sluice.usage.debt, and counts a failed one in sluice.usage.settle_errors;
// and, when the request's span is recording, adds to it the event
// "sluice.settle" (SettleEvent) with sluice.rule, sluice.policy,
// sluice.settled_cost (what the request used in all), sluice.charged (the
// difference charged, negative when given back) and sluice.debt. It
// implements middleware.Observer.
func (m *Metrics) Settled(e middleware.SettleEvent) {
	ctx := context.Background()
	m.settleEvent(e)
	rule := attribute.String("rule", m.capLabel(e.Rule))
	if e.Err != nil {
		m.usage.errors.Add(ctx, 1, m.with(rule))
		return
	}
	policy := attribute.String("policy", m.capLabel(e.Policy))
	switch {
	case e.Charged > 0:
		m.usage.settled.Add(ctx, int64(e.Charged), m.with(rule, policy))
	case e.Charged < 0:
		m.usage.refunded.Add(ctx, int64(-e.Charged), m.with(rule, policy))
	}
	if e.Debt > 0 {
		m.usage.debt.Record(ctx, int64(e.Debt), m.with(rule, policy))
	}
}

// SettleEvent is the name of the span event Settled adds.
const SettleEvent = "sluice.settle"

// settleEvent adds the settle to the request's span, if it is recording.
func (m *Metrics) settleEvent(e middleware.SettleEvent) {
	if !m.spanEvents || e.Context == nil {
		return
	}
	span := trace.SpanFromContext(e.Context)
	if !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{
		attribute.String("sluice.rule", e.Rule),
		attribute.String("sluice.policy", e.Policy),
		attribute.Int("sluice.settled_cost", e.Units),
		attribute.Int("sluice.charged", e.Charged),
		attribute.Int("sluice.debt", e.Debt),
	}
	if e.Err != nil {
		attrs = append(attrs, attribute.Bool("sluice.error", true))
	}
	span.AddEvent(SettleEvent, trace.WithAttributes(attrs...))
}
