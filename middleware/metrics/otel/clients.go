package sluiceotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The names of the instruments of bans and per-client overrides.
const (
	BansStarted = "sluice.bans"
	Bans        = "sluice.bans.in_force"
	Overrides   = "sluice.overrides.in_force"
)

// clientInstruments count bans started and the bans and overrides in
// force, fed by the Observer events BanStarted and ClientState.
type clientInstruments struct {
	started   metric.Int64Counter
	bans      metric.Int64Gauge
	overrides metric.Int64Gauge
}

func (m *Metrics) initClients(meter metric.Meter) error {
	c := &m.clients
	var errs [3]error
	c.started, errs[0] = meter.Int64Counter(BansStarted, metric.WithUnit("{ban}"),
		metric.WithDescription("Clients banned by a limit with a ban, by rule."))
	c.bans, errs[1] = meter.Int64Gauge(Bans, metric.WithUnit("{ban}"),
		metric.WithDescription("Bans in force (the fleet's, with Redis)."))
	c.overrides, errs[2] = meter.Int64Gauge(Overrides, metric.WithUnit("{override}"),
		metric.WithDescription("Per-client overrides of rules' limits in force (the fleet's, with Redis)."))
	return errors.Join(errs[:]...)
}

// BanStarted counts a ban in sluice.bans. It implements
// middleware.Observer.
func (m *Metrics) BanStarted(rule string, _ time.Duration) {
	m.clients.started.Add(context.Background(), 1, m.with(attribute.String("rule", m.capLabel(rule))))
}

// ClientState records sluice.overrides.in_force and sluice.bans.in_force. It implements
// middleware.Observer.
func (m *Metrics) ClientState(overrides, bans int) {
	m.clients.overrides.Record(context.Background(), int64(overrides), m.with())
	m.clients.bans.Record(context.Background(), int64(bans), m.with())
}
