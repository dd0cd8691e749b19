package sluiceotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the instruments of adaptive concurrency, shedding and
// elastic limits.
const (
	AdaptiveLimit = "sluice.adaptive.limit"
	SpareCapacity = "sluice.spare_capacity"
	ElasticLimit  = "sluice.elastic.limit"
	Shed          = "sluice.shed"
)

// capacityInstruments are the gauges of the capacity signals and the
// counter of shed requests, fed by the Observer events CapacityChanged,
// ElasticChanged and Shed.
type capacityInstruments struct {
	limit   metric.Int64Gauge
	spare   metric.Float64Gauge
	elastic metric.Int64Gauge
	shed    metric.Int64Counter
	mu      sync.Mutex
	seen    map[string]bool // rule and policy attribute values
}

func (m *Metrics) initCapacity(meter metric.Meter) error {
	c := &m.capacity
	c.seen = map[string]bool{}
	var errs [4]error
	c.limit, errs[0] = meter.Int64Gauge(AdaptiveLimit, metric.WithUnit("{request}"),
		metric.WithDescription("The adaptive concurrency limit in force, by rule with adaptive_concurrency."))
	c.spare, errs[1] = meter.Float64Gauge(SpareCapacity, metric.WithUnit("1"),
		metric.WithDescription(`Share of capacity left unused, 0 to 1: by rule with adaptive_concurrency, and rule="" for the signal elastic limits follow.`))
	c.elastic, errs[2] = meter.Int64Gauge(ElasticLimit, metric.WithUnit("{request}"),
		metric.WithDescription("The limit in force of an elastic limit (one with a ceiling), between its limit and its ceiling."))
	c.shed, errs[3] = meter.Int64Counter(Shed, metric.WithUnit("{request}"),
		metric.WithDescription("Requests an adaptive concurrency limit refused, by rule and priority (sheddable, normal, high, critical)."))
	return errors.Join(errs[:]...)
}

// label returns v, or OtherLabel once the cap of distinct values is
// reached.
func (m *Metrics) capLabel(v string) string {
	c := &m.capacity
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[v] {
		return v
	}
	if len(c.seen) >= m.max {
		return OtherLabel
	}
	c.seen[v] = true
	return v
}

// CapacityChanged records sluice.adaptive.limit and sluice.spare_capacity.
// It implements middleware.Observer.
func (m *Metrics) CapacityChanged(e middleware.CapacityEvent) {
	rule := attribute.String("rule", m.capLabel(e.Rule))
	if e.Rule != "" {
		m.capacity.limit.Record(context.Background(), int64(e.Limit), m.with(rule))
	}
	m.capacity.spare.Record(context.Background(), e.Spare, m.with(rule))
}

// ElasticChanged records sluice.elastic.limit. It implements
// middleware.Observer.
func (m *Metrics) ElasticChanged(e middleware.ElasticEvent) {
	m.capacity.elastic.Record(context.Background(), int64(e.Effective),
		m.with(attribute.String("rule", m.capLabel(e.Rule)), attribute.String("policy", m.capLabel(e.Policy))))
}

// Shed counts a request an adaptive concurrency limit refused, under
// sluice.shed. It implements middleware.Observer.
func (m *Metrics) Shed(rule string, p middleware.Priority) {
	m.capacity.shed.Add(context.Background(), 1,
		m.with(attribute.String("rule", m.capLabel(rule)), attribute.String("priority", p.String())))
}
