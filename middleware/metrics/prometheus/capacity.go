package sluiceprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the metrics of adaptive concurrency, shedding and elastic
// limits.
const (
	AdaptiveLimit = "sluice_adaptive_limit"
	SpareCapacity = "sluice_spare_capacity"
	ElasticLimit  = "sluice_elastic_limit"
	ShedTotal     = "sluice_shed_total"
)

// capacityMetrics are the gauges of the capacity signals and the counter
// of shed requests, fed by the Observer events CapacityChanged,
// ElasticChanged and Shed.
type capacityMetrics struct {
	mu      sync.Mutex
	limit   *prometheus.GaugeVec   // rule
	spare   *prometheus.GaugeVec   // rule ("" for the Limiter's signal)
	elastic *prometheus.GaugeVec   // rule, policy
	shed    *prometheus.CounterVec // rule, priority
	seen    map[string]bool        // rule and policy label values
}

func newCapacityMetrics(cl prometheus.Labels) capacityMetrics {
	return capacityMetrics{
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: AdaptiveLimit, ConstLabels: cl,
			Help: "The adaptive concurrency limit in force, by rule with adaptive_concurrency."}, []string{"rule"}),
		spare: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: SpareCapacity, ConstLabels: cl,
			Help: `Share of capacity left unused, 0 to 1: by rule with adaptive_concurrency, and rule="" for the signal elastic limits follow.`}, []string{"rule"}),
		elastic: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ElasticLimit, ConstLabels: cl,
			Help: "The limit in force of an elastic limit (one with a ceiling), between its limit and its ceiling."}, []string{"rule", "policy"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ShedTotal, ConstLabels: cl,
			Help: "Requests an adaptive concurrency limit refused, by rule and priority (sheddable, normal, high, critical)."}, []string{"rule", "priority"}),
		seen: map[string]bool{},
	}
}

// label returns v, or OtherLabel once max distinct values were seen.
func (c *capacityMetrics) label(v string, max int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen[v] {
		return v
	}
	if len(c.seen) >= max {
		return OtherLabel
	}
	c.seen[v] = true
	return v
}

func (c *capacityMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.limit, c.spare, c.elastic, c.shed}
}

// CapacityChanged sets sluice_adaptive_limit and sluice_spare_capacity.
// It implements middleware.Observer.
func (m *Metrics) CapacityChanged(e middleware.CapacityEvent) {
	rule := m.capacity.label(e.Rule, m.max)
	if e.Rule != "" {
		m.capacity.limit.WithLabelValues(rule).Set(float64(e.Limit))
	}
	m.capacity.spare.WithLabelValues(rule).Set(e.Spare)
}

// ElasticChanged sets sluice_elastic_limit. It implements
// middleware.Observer.
func (m *Metrics) ElasticChanged(e middleware.ElasticEvent) {
	m.capacity.elastic.WithLabelValues(m.capacity.label(e.Rule, m.max), m.capacity.label(e.Policy, m.max)).Set(float64(e.Effective))
}

// Shed counts a request an adaptive concurrency limit refused. It
// implements middleware.Observer.
func (m *Metrics) Shed(rule string, p middleware.Priority) {
	m.capacity.shed.WithLabelValues(m.capacity.label(rule, m.max), p.String()).Inc()
}
