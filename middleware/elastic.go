package middleware

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/adaptive"
)

// Elastic limits
//
// A Limit with a Ceiling above its Requests is elastic: a client may go
// past Requests, up to Ceiling, while the app servers have spare capacity.
// The limit in force (the effective limit) is
//
//	Requests + ⌊(Ceiling - Requests) · factor⌋
//
// where factor in [0, 1] follows the spare capacity of the Limiter's
// capacity signal (see WithCapacity): down at once when load rises, back up
// slowly after a cool-off. With a store shared by several app servers
// (Redis), each server publishes its spare capacity and the factor follows
// the least spare capacity of the fleet, so that load on one server pulls
// the others' clients back too.
//
// A client always gets at least min(its demand, Requests): an elastic limit
// counts in two counters, the limit's own (Requests per Window, as without
// a ceiling) and the elastic headroom's (effective - Requests per Window).
// A request goes to the limit's own counter while it has room and only
// then to the headroom's, so what a client took from the headroom while it
// was open never eats into its own limit once it closes.

// CapacityConfig configures the Limiter's capacity signal, which elastic
// limits follow: a gradient controller (as for AdaptiveConcurrency) fed the
// latency of every request the Limiter admits, from Decide to Result.Done,
// whose spare capacity is the share of its concurrency limit left unused,
// and nothing while requests queue. The zero value is ready to use.
type CapacityConfig struct {
	// Min and Max bound the signal's concurrency limit, and Initial is
	// where it starts; 0 means 4, 10000 and Min. Initial sets how many
	// requests in flight an idle server counts as its capacity until load
	// teaches it better.
	Min, Max, Initial int
	// CPU, when set, returns the CPU use of the app server in [0, 1] (for
	// example from /proc/stat). It is read at most every 100ms; at and
	// above CPULimit nothing is spare.
	CPU func() float64
	// CPULimit is the CPU use above which nothing is spare; 0 means 0.9.
	CPULimit float64
	// FullAt is the spare capacity at and above which elastic limits are
	// at their ceilings; 0 means 0.5. Below it they open in proportion.
	FullAt float64
	// CoolOff is how long elastic limits stay down after they last fell
	// before they open again; 0 means 2s. Rise is how long they then take
	// to open from their limits to their ceilings; 0 means 3s.
	CoolOff, Rise time.Duration
	// Server names this app server among those that share a store; ""
	// means a random name. FleetEvery is how often it publishes its spare
	// capacity and reads the fleet's (0 means 250ms), and FleetTTL how
	// long a published figure counts (0 means 2s), so that a server that
	// stopped publishing soon stops counting.
	Server               string
	FleetEvery, FleetTTL time.Duration
}

// WithCapacity configures the Limiter's capacity signal, which elastic
// limits (Limit.Ceiling) follow.
func WithCapacity(cc CapacityConfig) Option {
	return func(c *config) {
		switch {
		case cc.Min < 0 || cc.Max < 0 || cc.Initial < 0:
			c.errorf("WithCapacity: Min, Max and Initial must not be negative")
		case cc.CPULimit < 0 || cc.CPULimit > 1 || cc.FullAt < 0 || cc.FullAt > 1:
			c.errorf("WithCapacity: CPULimit and FullAt must be between 0 and 1")
		case cc.CoolOff < 0 || cc.Rise < 0 || cc.FleetEvery < 0 || cc.FleetTTL < 0:
			c.errorf("WithCapacity: durations must not be negative")
		}
		c.capacity = cc
	}
}

// fill sets the defaults of cc.
func (cc *CapacityConfig) fill() error {
	if cc.Min == 0 {
		cc.Min = 4
	}
	if cc.Max == 0 {
		cc.Max = 10000
	}
	if cc.Max < cc.Min {
		return fmt.Errorf("sluice: WithCapacity: Max %d is below Min %d", cc.Max, cc.Min)
	}
	if cc.Initial == 0 {
		cc.Initial = cc.Min
	}
	if cc.FleetEvery == 0 {
		cc.FleetEvery = 250 * time.Millisecond
	}
	if cc.FleetTTL == 0 {
		cc.FleetTTL = 2 * time.Second
	}
	if cc.FleetTTL < cc.FleetEvery {
		return fmt.Errorf("sluice: WithCapacity: FleetTTL %s is shorter than FleetEvery %s", cc.FleetTTL, cc.FleetEvery)
	}
	if cc.Server == "" {
		cc.Server = newSlotID()
	}
	return nil
}

// ElasticEvent reports to observers that the effective limit of an
// elastic limit changed.
type ElasticEvent struct {
	// Rule and Policy name the limit, as in Result.
	Rule, Policy string
	// Limit and Ceiling are the limit's Requests and Ceiling; Effective
	// is the limit in force, between them.
	Limit, Ceiling, Effective int
}

// elasticState is the factor of the Limiter's elastic limits and the
// fleet's spare capacity.
type elasticState struct {
	mu     sync.Mutex
	e      adaptive.Elastic
	factor float64
	// fleet is the fleet's spare capacity read at fleetAt from fleetN
	// servers; fleetAt is zero before the first read.
	fleet   float64
	fleetN  int
	fleetAt time.Time
	stop    chan struct{}
	done    chan struct{}
	closed  bool // by Limiter.Close: publishing does not start again
}

// spare returns the spare capacity elastic limits follow at now.
func (l *Limiter) elasticSpare(now time.Time) float64 {
	c := l.ov.measured()
	if c == nil {
		return 1
	}
	spare := c.Figures(now).Spare
	el := &l.ov.el
	el.mu.Lock()
	if !el.fleetAt.IsZero() && now.Sub(el.fleetAt) < l.cfg.capacity.FleetTTL {
		spare = min(spare, el.fleet)
	}
	el.mu.Unlock()
	return spare
}

// elasticFactor returns the factor of the elastic limits at now.
func (l *Limiter) elasticFactor(now time.Time) float64 {
	if l.ov.measured() == nil {
		l.ov.mu.Lock()
		l.ensureSignalLocked(now)
		l.ov.mu.Unlock()
	}
	spare := l.elasticSpare(now)
	el := &l.ov.el
	el.mu.Lock()
	f := el.e.Update(now, spare)
	moved := f != el.factor
	el.factor = f
	el.mu.Unlock()
	if moved && len(l.cfg.observers) > 0 {
		l.reportElastic(f)
	}
	return f
}

// elasticFigures returns the spare capacity, the fleet's and the factor.
func (l *Limiter) elasticFigures(now time.Time) (spare, fleet float64, servers int, factor float64) {
	factor = l.elasticFactor(now)
	spare = l.elasticSpare(now)
	el := &l.ov.el
	el.mu.Lock()
	defer el.mu.Unlock()
	if !el.fleetAt.IsZero() && now.Sub(el.fleetAt) < l.cfg.capacity.FleetTTL {
		fleet, servers = el.fleet, el.fleetN
	}
	return spare, fleet, servers, factor
}

// reportElastic tells observers the effective limits of the static
// elastic limits at factor f.
func (l *Limiter) reportElastic(f float64) {
	for _, r := range l.rules.Load().rules {
		for _, lim := range r.nominal {
			if lim.Ceiling <= lim.Requests {
				continue
			}
			e := ElasticEvent{Rule: r.Name, Policy: policyName(r.Name, lim, len(r.nominal)), Limit: lim.Requests, Ceiling: lim.Ceiling, Effective: adaptive.Effective(lim.Requests, lim.Ceiling, f)}
			for _, o := range l.cfg.observers {
				o.ElasticChanged(e)
			}
		}
	}
}

// fleetPublisher is implemented by stores shared by app servers that can
// carry their spare capacity: the Redis store.
type fleetPublisher interface {
	publishSpare(ctx context.Context, now time.Time, server string, spare float64, ttl time.Duration) (fleet float64, servers int, err error)
}

// startFleet starts publishing this server's spare capacity to a shared
// store, if the store can carry it; the caller holds ov.mu.
func (l *Limiter) startFleet() {
	if _, ok := l.cfg.store.(fleetPublisher); !ok {
		return
	}
	el := &l.ov.el
	if el.stop != nil || el.closed {
		return
	}
	el.stop, el.done = make(chan struct{}), make(chan struct{})
	go func(stop, done chan struct{}) {
		defer close(done)
		t := time.NewTicker(l.cfg.capacity.FleetEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), l.cfg.capacity.FleetEvery)
				if err := l.publishSpare(ctx, time.Time{}); err != nil {
					l.cfg.report(nil, fmt.Errorf("%w: publish spare capacity: %w", ErrStore, err))
				}
				cancel()
			}
		}
	}(el.stop, el.done)
}

// publishSpare publishes this server's spare capacity and reads the
// fleet's. now is the instant for the store (zero: its own clock); the
// figure read counts from the Limiter's clock.
func (l *Limiter) publishSpare(ctx context.Context, now time.Time) error {
	p, ok := l.cfg.store.(fleetPublisher)
	c := l.ov.measured()
	if !ok || c == nil {
		return nil
	}
	at := l.overloadNow()
	local := c.Figures(at).Spare
	fleet, n, err := p.publishSpare(ctx, now, l.cfg.capacity.Server, local, l.cfg.capacity.FleetTTL)
	if err != nil {
		return err
	}
	el := &l.ov.el
	el.mu.Lock()
	el.fleet, el.fleetN, el.fleetAt = fleet, n, at
	el.mu.Unlock()
	return nil
}

// stopFleet stops publishing the spare capacity, for good.
func (l *Limiter) stopFleet() {
	el := &l.ov.el
	l.ov.mu.Lock()
	stop, done := el.stop, el.done
	el.stop, el.closed = nil, true
	l.ov.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}
