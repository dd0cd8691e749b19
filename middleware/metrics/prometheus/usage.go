package sluiceprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/middleware"
)

// The names of the metrics of usage limits (middleware.Usage).
const (
	UsageSettledTotal  = "sluice_usage_settled_total"
	UsageRefundedTotal = "sluice_usage_refunded_total"
	UsageDebt          = "sluice_usage_debt"
	UsageErrorsTotal   = "sluice_usage_settle_errors_total"
)

// usageMetrics count what settles charged and gave back, and the debts
// they left, fed by the Observer event Settled.
type usageMetrics struct {
	settled  *prometheus.CounterVec   // rule, policy
	refunded *prometheus.CounterVec   // rule, policy
	debt     *prometheus.HistogramVec // rule, policy
	errors   *prometheus.CounterVec   // rule
}

func newUsageMetrics(cl prometheus.Labels) usageMetrics {
	return usageMetrics{
		settled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: UsageSettledTotal, ConstLabels: cl,
			Help: "Units of usage charged after the fact, beyond requests' estimates, by rule and usage limit."}, []string{"rule", "policy"}),
		refunded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: UsageRefundedTotal, ConstLabels: cl,
			Help: "Units of requests' estimates given back when they used less, by rule and usage limit."}, []string{"rule", "policy"}),
		debt: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: UsageDebt, ConstLabels: cl,
			Help:    "Debt a settle left on a usage limit, in units past the limit, observed at each settle that took a client's counter past it.",
			Buckets: prometheus.ExponentialBuckets(1, 10, 9)}, []string{"rule", "policy"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: UsageErrorsTotal, ConstLabels: cl,
			Help: "Settles of usage that the store failed to count, by rule."}, []string{"rule"}),
	}
}

func (u *usageMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{u.settled, u.refunded, u.debt, u.errors}
}

// Settled counts the units a settle charged (sluice_usage_settled_total)
// or gave back (sluice_usage_refunded_total), observes the debt it
// left in sluice_usage_debt_units, and counts a failed one in
// sluice_usage_settle_errors_total. It implements middleware.Observer.
func (m *Metrics) Settled(e middleware.SettleEvent) {
	rule := m.capacity.label(e.Rule, m.max)
	policy := m.capacity.label(e.Policy, m.max)
	if e.Err != nil {
		m.usage.errors.WithLabelValues(rule).Inc()
		return
	}
	switch {
	case e.Charged > 0:
		m.usage.settled.WithLabelValues(rule, policy).Add(float64(e.Charged))
	case e.Charged < 0:
		m.usage.refunded.WithLabelValues(rule, policy).Add(float64(-e.Charged))
	}
	if e.Debt > 0 {
		m.usage.debt.WithLabelValues(rule, policy).Observe(float64(e.Debt))
	}
}
