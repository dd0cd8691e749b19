package middleware

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/adaptive"
	"github.com/sluicehq/sluice/keyfunc"
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

// controller is the capacity signal of one adaptive rule, or the Limiter's
// own signal for elastic limits, safe for concurrent use.
type controller struct {
	name string // the rule's, "" for the Limiter's signal
	mu   sync.Mutex
	g    *adaptive.Gradient
	shed adaptive.Shedder
	hard int
	cpu  func() float64
	// cpuAt is when the CPU was last read.
	cpuAt time.Time
	// reported is the limit and spare last told to observers.
	repLimit int
	repSpare float64
	cfg      adaptive.Config
}

func newController(name string, cfg adaptive.Config, cpu func() float64, now time.Time) *controller {
	return &controller{name: name, g: adaptive.New(cfg, now), hard: cfg.Max, cpu: cpu, cfg: cfg, repSpare: -1}
}

// advance moves the controller to now; the caller holds mu.
func (c *controller) advance(now time.Time) {
	if c.cpu != nil && now.Sub(c.cpuAt) >= 100*time.Millisecond {
		c.cpuAt = now
		c.g.ObserveCPU(c.cpu())
	}
	c.g.Advance(now)
}

// changed returns the event to report if the limit or the spare moved
// since the last report; the caller holds mu.
func (c *controller) changed() (CapacityEvent, bool) {
	lim, spare := c.g.Limit(), c.g.Spare()
	if lim == c.repLimit && spare == c.repSpare {
		return CapacityEvent{}, false
	}
	c.repLimit, c.repSpare = lim, spare
	return CapacityEvent{Rule: c.name, Limit: lim, InFlight: c.g.InFlight(), Spare: spare, MinLatency: c.g.MinLatency(), Latency: c.g.Latency()}, true
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

// overload is the Limiter's state for adaptive concurrency, shedding and
// elastic limits.
type overload struct {
	mu    sync.Mutex
	rules map[string]*controller // by rule name
	// signal measures every request the Limiter admits, for elastic
	// limits; nil while no rule has one.
	signal *controller
	live   atomic.Pointer[controller] // signal, read without mu
	el     elasticState
}

// overloadHold is what an admitted request holds of the capacity signals:
// given back, with its latency, by Result.Done.
type overloadHold struct {
	began  time.Time
	ctrls  []*controller // of the adaptive rules whose places it holds
	signal *controller
	// priority is the request's, when an adaptive rule applied.
	priority Priority
	// shadow names a shadow adaptive rule (or any, in shadow mode) that
	// would have refused the request.
	shadow string
}

// bindOverload gives each adaptive rule of set its controller, keeping
// those of rules whose name and bounds are unchanged, and starts or stops
// the Limiter's signal for elastic limits.
func (l *Limiter) bindOverload(set *ruleSet) {
	ov := &l.ov
	ov.mu.Lock()
	defer ov.mu.Unlock()
	now := l.overloadNow()
	next := map[string]*controller{}
	elastic := false
	for _, r := range set.rules {
		elastic = elastic || r.elastic
		a := r.AdaptiveConcurrency
		if a == nil {
			continue
		}
		cfg := adaptive.Config{Min: a.Min, Max: a.Max, CPULimit: l.cfg.capacity.CPULimit}
		c := ov.rules[r.Name]
		if c == nil || c.cfg.Min != a.Min || c.cfg.Max != a.Max {
			c = newController(r.Name, cfg, l.cfg.capacity.CPU, now)
		}
		next[r.Name] = c
		r.ctrl = c
	}
	ov.rules = next
	set.overload = len(next) > 0
	if elastic {
		l.ensureSignalLocked(now)
	}
}

// ensureSignalLocked starts the Limiter's signal for elastic limits if it
// has none yet; the caller holds ov.mu.
func (l *Limiter) ensureSignalLocked(now time.Time) *controller {
	ov := &l.ov
	if c := ov.signal; c != nil {
		return c
	}
	cc := l.cfg.capacity
	c := newController("", adaptive.Config{Min: cc.Min, Max: cc.Max, Initial: cc.Initial, CPULimit: cc.CPULimit}, cc.CPU, now)
	ov.signal = c
	ov.el.mu.Lock()
	ov.el.e = adaptive.Elastic{FullAt: cc.FullAt, CoolOff: cc.CoolOff, Rise: cc.Rise}
	ov.el.mu.Unlock()
	ov.live.Store(c)
	l.startFleet()
	return c
}

// measured returns the Limiter's signal, nil while no elastic limit
// needed one.
func (ov *overload) measured() *controller { return ov.live.Load() }

// overloadNow is the instant the capacity signals are moved to.
func (l *Limiter) overloadNow() time.Time {
	if l.cfg.clock != nil {
		return l.cfg.clock()
	}
	return time.Now()
}

// requestPriority returns the priority of a request that adaptive rules
// apply to: WithPriority's, else the highest the applying rules set,
// else normal.
func (l *Limiter) requestPriority(r keyfunc.Request, s *scratch) Priority {
	if fn := l.cfg.overload.priority; fn != nil {
		if p := fn(r); p != PriorityUnset && p.valid() {
			return p
		}
	}
	if s.priority != PriorityUnset {
		return s.priority
	}
	return PriorityNormal
}

// noteOverload records in s what rule brings to overload protection, and
// reports whether that is all the rule does (it has no limits and no
// concurrency), in which case it needs no key.
func (s *scratch) noteOverload(rule *compiledRule) (only bool) {
	if rule.Priority > s.priority {
		s.priority = rule.Priority
	}
	if rule.ctrl != nil {
		s.adaptive = append(s.adaptive, rule)
	}
	return rule.overloadOnly
}

// admitOverload takes a place under every adaptive limit that applies to
// the request, all or nothing. When one refuses, it writes the denial to
// res and reports it.
func (l *Limiter) admitOverload(r keyfunc.Request, s *scratch, res *Result) (*overloadHold, bool) {
	if !l.rules.Load().overload && l.ov.measured() == nil {
		return nil, false
	}
	now := l.overloadNow()
	oh := &overloadHold{began: now}
	if len(s.adaptive) == 0 {
		return oh, false
	}
	p := l.requestPriority(r, s)
	oh.priority = p
	var events [4]CapacityEvent
	nev := 0
	for _, rule := range s.adaptive {
		c := rule.ctrl
		c.mu.Lock()
		c.advance(now)
		limit, inflight := c.g.Limit(), c.g.InFlight()
		ok := c.shed.Admit(now, p.shedClass(), inflight, limit, c.hard)
		if !ok && (rule.Shadow || l.cfg.shadow) {
			// Reported, never refused: the request runs and counts.
			ok = true
			if oh.shadow == "" {
				oh.shadow = rule.Name
			}
		}
		if ok {
			c.g.Start(now)
		}
		if e, changed := c.changed(); changed && nev < len(events) {
			events[nev] = e
			nev++
		}
		c.mu.Unlock()
		if !ok {
			oh.end(now, false) // the places taken so far
			for _, o := range l.cfg.observers {
				for _, e := range events[:nev] {
					o.CapacityChanged(e)
				}
				o.Shed(rule.Name, p)
			}
			a := rule.AdaptiveConcurrency
			status := a.Status
			if status == 0 {
				status = http.StatusServiceUnavailable
			}
			*res = Result{
				Applied: true, Policy: rule.Name, Rule: rule.Name,
				Limit:      Limit{Requests: adaptive.Threshold(p.shedClass(), limit, c.hard)},
				RetryAfter: ConcurrencyRetryAfter, NextAfter: ConcurrencyRetryAfter,
				Concurrency: true, Shed: true, Priority: p, InFlight: inflight,
				status: status, Outcome: OutcomeDenied,
			}
			return nil, true
		}
		oh.ctrls = append(oh.ctrls, c)
	}
	for _, o := range l.cfg.observers {
		for _, e := range events[:nev] {
			o.CapacityChanged(e)
		}
	}
	return oh, false
}

// settleOverload runs when decide returns: an admitted request keeps its
// places until Result.Done, and the Limiter's signal counts it in flight;
// any other gives its places back at once.
func (l *Limiter) settleOverload(oh *overloadHold, s *scratch, res *Result) {
	if oh == nil {
		return
	}
	res.Elastic = s.elUsed && res.Allowed
	if len(s.adaptive) > 0 {
		res.Priority = oh.priority
	}
	if oh.shadow != "" && res.Allowed && !res.Shadowed {
		res.Shadowed, res.ShadowPolicy = true, oh.shadow
		if res.Outcome == OutcomeAllowed || res.Outcome == OutcomeUnlimited {
			res.Outcome = OutcomeShadowDenied
		}
	}
	if !res.Allowed || res.Outcome == OutcomeGaveUp {
		oh.signal = nil
		oh.end(l.overloadNow(), false)
		return
	}
	if c := l.ov.measured(); c != nil {
		oh.signal = c
		c.mu.Lock()
		c.advance(oh.began)
		c.g.Start(oh.began)
		e, changed := c.changed()
		c.mu.Unlock()
		if changed {
			for _, o := range l.cfg.observers {
				o.CapacityChanged(e)
			}
		}
	}
	if res.hold == nil {
		res.hold = &hold{l: l}
	}
	res.hold.ov = oh
}

// end gives back the places of oh at now; sample says whether the
// request's latency is a sample of the service's.
func (oh *overloadHold) end(now time.Time, sample bool) []CapacityEvent {
	var evs []CapacityEvent
	lat := now.Sub(oh.began)
	for _, c := range append(oh.ctrls[:len(oh.ctrls):len(oh.ctrls)], oh.signal) {
		if c == nil {
			continue
		}
		c.mu.Lock()
		c.advance(now)
		c.g.End(now, lat, sample)
		if e, changed := c.changed(); changed {
			evs = append(evs, e)
		}
		c.mu.Unlock()
	}
	return evs
}

// releaseOverload is Result.Done's part for the capacity signals.
func (h *hold) releaseOverload() {
	if h.ov == nil {
		return
	}
	evs := h.ov.end(h.l.overloadNow(), true)
	for _, o := range h.l.cfg.observers {
		for _, e := range evs {
			o.CapacityChanged(e)
		}
	}
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
		c.mu.Lock()
		c.advance(now)
		st.Rules[name] = CapacityEvent{Rule: name, Limit: c.g.Limit(), InFlight: c.g.InFlight(), Spare: c.g.Spare(), MinLatency: c.g.MinLatency(), Latency: c.g.Latency()}
		c.mu.Unlock()
	}
	if signal != nil {
		signal.mu.Lock()
		signal.advance(now)
		st.Signal = CapacityEvent{Limit: signal.g.Limit(), InFlight: signal.g.InFlight(), Spare: signal.g.Spare(), MinLatency: signal.g.MinLatency(), Latency: signal.g.Latency()}
		signal.mu.Unlock()
		st.Spare, st.FleetSpare, st.FleetServers, st.Factor = l.elasticFigures(now)
	}
	return st
}

// overloadConfig is the Limiter's configuration of shedding.
type overloadConfig struct {
	priority func(keyfunc.Request) Priority
}

// overloadScratch is the per-request state of overload protection and
// elastic limits, part of scratch.
type overloadScratch struct {
	// priority is the highest Priority of the rules that apply.
	priority Priority
	// adaptive are the rules with AdaptiveConcurrency that apply.
	adaptive []*compiledRule
	// elastic are the charges of elastic limits; elNominal their
	// effective limits; elAlt and elDec the charges and decisions of the
	// second try, against the headroom; elUsed reports that the request
	// was admitted on the headroom.
	elastic   []elasticCharge
	elNominal []Limit
	elAlt     []Charge
	elDec     []Decision
	elUsed    bool
}

func (o *overloadScratch) reset() {
	clear(o.adaptive)
	o.priority, o.adaptive, o.elUsed = PriorityUnset, o.adaptive[:0], false
	o.elastic, o.elNominal, o.elAlt = o.elastic[:0], o.elNominal[:0], o.elAlt[:0]
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
