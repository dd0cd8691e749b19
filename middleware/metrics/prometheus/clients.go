package sluiceprom

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The names of the metrics of bans and per-client overrides.
const (
	BansTotal = "sluice_bans_total"
	Bans      = "sluice_bans_in_force"
	Overrides = "sluice_overrides_in_force"
)

// clientMetrics count bans started and the bans and overrides in force,
// fed by the Observer events BanStarted and ClientState.
type clientMetrics struct {
	started   *prometheus.CounterVec // rule
	bans      prometheus.Gauge
	overrides prometheus.Gauge
}

func newClientMetrics(cl prometheus.Labels) clientMetrics {
	return clientMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: BansTotal, ConstLabels: cl,
			Help: "Clients banned by a limit with a ban, by rule."}, []string{"rule"}),
		bans: prometheus.NewGauge(prometheus.GaugeOpts{Name: Bans, ConstLabels: cl,
			Help: "Bans in force (the fleet's, with Redis)."}),
		overrides: prometheus.NewGauge(prometheus.GaugeOpts{Name: Overrides, ConstLabels: cl,
			Help: "Per-client overrides of rules' limits in force (the fleet's, with Redis)."}),
	}
}

func (c *clientMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.started, c.bans, c.overrides}
}

// BanStarted counts a ban in sluice_bans_total. It implements
// middleware.Observer.
func (m *Metrics) BanStarted(rule string, _ time.Duration) {
	m.clients.started.WithLabelValues(m.capacity.label(rule, m.max)).Inc()
}

// ClientState sets sluice_overrides_in_force and sluice_bans_in_force. It implements
// middleware.Observer.
func (m *Metrics) ClientState(overrides, bans int) {
	m.clients.overrides.Set(float64(overrides))
	m.clients.bans.Set(float64(bans))
}
