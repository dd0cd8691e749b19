package middleware

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/internal/adaptive"
)

// AdaptiveConcurrency is a concurrency limit of a whole app server that
// follows the service's latency (Rule.AdaptiveConcurrency): a gradient
// controller, after Netflix's Gradient2 and Envoy's adaptive concurrency
// filter, raises the limit while the latency of the requests the rule
// admits stays near its minimum and cuts it as soon as they queue. The
// minimum latency is measured afresh every 30 s, with the limit held at
// Min for the few requests the measure takes.
//
// The limit is per app server and per rule, whatever the rule's key: it
// protects this process, not a client's quota. A request over the limit is
// refused at once with Status (503 Service Unavailable by default) and a
// Retry-After of ConcurrencyRetryAfter, and charged to no rate limit.
// Requests are shed by Priority: sheddable ones once half the adaptive
// limit is in flight, normal ones at the limit, high ones half-way to Max
// and critical ones only at Max, the hard limit; after a refusal, every
// lower priority is refused for a second.
type AdaptiveConcurrency struct {
	// Min and Max bound the adaptive limit: 1 <= Min <= Max. Max is the
	// hard limit, which only critical requests reach.
	Min, Max int
	// Status is the status of a refused request: 503 Service Unavailable
	// (the default, 0) or 429 Too Many Requests.
	Status int
}

func (a *AdaptiveConcurrency) validate() error {
	if a.Min < 1 || a.Max < a.Min {
		return fmt.Errorf("adaptive concurrency: min %d and max %d: want 1 <= min <= max", a.Min, a.Max)
	}
	if a.Max > 1_000_000 {
		return fmt.Errorf("adaptive concurrency: max %d is over 1000000", a.Max)
	}
	switch a.Status {
	case 0, http.StatusServiceUnavailable, http.StatusTooManyRequests:
	default:
		return fmt.Errorf("adaptive concurrency: status %d: want 503 or 429", a.Status)
	}
	return nil
}

// controller is the capacity signal of one adaptive rule (name is the
// rule's), or the Limiter's own signal for elastic limits (name "").
type controller struct {
	name string
	*adaptive.Controller
}

func newController(name string, cfg adaptive.Config, cpu func() float64, now time.Time) *controller {
	return &controller{name: name, Controller: adaptive.NewController(cfg, cpu, now)}
}

// event is the CapacityEvent of figures f of c.
func (c *controller) event(f adaptive.Figures) CapacityEvent {
	return CapacityEvent{Rule: c.name, Limit: f.Limit, InFlight: f.InFlight, Spare: f.Spare, MinLatency: f.MinLatency, Latency: f.Latency}
}

// CapacityEvent reports a change of a capacity signal to observers: the
// adaptive limit of a rule with AdaptiveConcurrency, or (Rule "") the
// Limiter's own signal that elastic limits follow.
type CapacityEvent struct {
	// Rule names the rule; "" for the Limiter's signal.
	Rule string
	// Limit is the adaptive concurrency limit in force.
	Limit int
	// InFlight is how many requests were in flight.
	InFlight int
	// Spare is the share of capacity left unused, in [0, 1].
	Spare float64
	// MinLatency is the minimum latency measured and Latency that of the
	// last window of samples.
	MinLatency, Latency time.Duration
}

// CapacityStats are the figures of a Limiter's capacity signals.
type CapacityStats struct {
	// Rules are the adaptive concurrency rules' signals, by rule name.
	Rules map[string]CapacityEvent
	// Signal is the Limiter's own signal, which elastic limits follow;
	// its Rule is "". Zero while no rule has an elastic limit.
	Signal CapacityEvent
	// Spare is the spare capacity elastic limits follow: the lesser of
	// the Limiter's signal's and, with a shared store, the fleet's.
	Spare float64
	// FleetSpare is the fleet's spare capacity as last read from the
	// store (the least of the app servers'), and FleetServers how many
	// app servers published theirs; both zero without a shared store.
	FleetSpare   float64
	FleetServers int
	// Factor is how far elastic limits are open towards their ceilings,
	// in [0, 1].
	Factor float64
}

// Capacity returns the figures of the limiter's capacity signals: the
// adaptive limits of its rules, its spare capacity and how far its elastic
// limits are open.
func (l *Limiter) Capacity() CapacityStats {
	now := l.overloadNow()
	st := CapacityStats{Rules: map[string]CapacityEvent{}}
	l.ov.mu.Lock()
	rules, signal := l.ov.rules, l.ov.signal
	l.ov.mu.Unlock()
	for name, c := range rules {
		st.Rules[name] = c.event(c.Figures(now))
	}
	if signal != nil {
		st.Signal = signal.event(signal.Figures(now))
		st.Spare, st.FleetSpare, st.FleetServers, st.Factor = l.elasticFigures(now)
	}
	return st
}

// compileOverload checks and notes the rule's adaptive concurrency,
// priority and elastic limits.
func (c *compiledRule) compileOverload() error {
	if a := c.AdaptiveConcurrency; a != nil {
		if err := a.validate(); err != nil {
			return err
		}
		cp := *a
		c.AdaptiveConcurrency = &cp
	}
	if !c.Priority.valid() {
		return fmt.Errorf("priority %d is unknown", c.Priority)
	}
	for _, l := range c.Limits {
		if err := validateCeiling(l); err != nil {
			return err
		}
		if l.Ceiling > 0 {
			c.elastic = true
			if c.Overage != 0 {
				return fmt.Errorf("limit %s: a limit with a ceiling has no overage", l)
			}
		}
	}
	c.overloadOnly = len(c.Limits) == 0 && c.LimitsFunc == nil && c.Concurrency == 0 && !c.Deny
	return nil
}

// validateCeiling checks the Ceiling of l.
func validateCeiling(l Limit) error {
	if l.Ceiling == 0 {
		return nil
	}
	if l.Ceiling <= l.Requests {
		return fmt.Errorf("limit %s: ceiling %d must be above the limit's %d requests", l, l.Ceiling, l.Requests)
	}
	if l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket {
		return fmt.Errorf("limit %s: a ceiling needs a sliding window, a fixed window or a sliding log", l)
	}
	if l.Ceiling > 1<<50 {
		return fmt.Errorf("limit %s: ceiling %d is over 2^50", l, l.Ceiling)
	}
	return nil
}
