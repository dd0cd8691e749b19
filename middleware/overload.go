package middleware

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/adaptive"
	"github.com/sluicehq/sluice/keyfunc"
)

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
		if c == nil || c.Config().Min != a.Min || c.Config().Max != a.Max {
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
		a := c.Admit(now, p.shedClass(), rule.Shadow || l.cfg.shadow)
		if a.Refused && a.Admitted && oh.shadow == "" {
			// Reported, never refused: the request runs and counts.
			oh.shadow = rule.Name
		}
		if a.Changed && nev < len(events) {
			events[nev] = c.event(a.Figures)
			nev++
		}
		if !a.Admitted {
			oh.end(now, false) // the places taken so far
			for _, o := range l.cfg.observers {
				for _, e := range events[:nev] {
					o.CapacityChanged(e)
				}
				o.Shed(rule.Name, p)
			}
			status := rule.AdaptiveConcurrency.Status
			if status == 0 {
				status = http.StatusServiceUnavailable
			}
			*res = Result{
				Applied: true, Policy: rule.Name, Rule: rule.Name,
				Limit:      Limit{Requests: a.Threshold},
				RetryAfter: ConcurrencyRetryAfter, NextAfter: ConcurrencyRetryAfter,
				Concurrency: true, Shed: true, Priority: p, InFlight: a.InFlight,
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
		if f, changed := c.Start(oh.began); changed {
			for _, o := range l.cfg.observers {
				o.CapacityChanged(c.event(f))
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
		if f, changed := c.End(now, lat, sample); changed {
			evs = append(evs, c.event(f))
		}
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

// elasticCharge is a charge of an elastic limit: the index of its charge
// and the headroom open at the request's instant.
type elasticCharge struct {
	idx      int
	headroom int // effective - Requests
}

// elasticSuffix names the counter of an elastic limit's headroom: the
// rule's name with a character rule names cannot have, so it names no
// rule's counter.
const elasticSuffix = "~elastic"

// elasticLimits rewrites, for a request, the limits of a rule some of
// whose limits are elastic: the nominal limits become the effective ones
// (what the headers advertise) and the policy is formatted afresh. base
// is the index the rule's first charge will have. The charged limits are
// unchanged: each elastic charge goes to its own counter first.
func (l *Limiter) elasticLimits(s *scratch, base int, nominal []Limit, names []string) ([]Limit, string) {
	now := l.overloadNow()
	f := l.elasticFactor(now)
	start := len(s.elNominal)
	ps := make([]headers.Policy, len(nominal))
	for i, lim := range nominal {
		if lim.Ceiling > lim.Requests {
			eff := adaptive.Effective(lim.Requests, lim.Ceiling, f)
			s.elastic = append(s.elastic, elasticCharge{idx: base + i, headroom: eff - lim.Requests})
			lim.Requests = eff
		}
		s.elNominal = append(s.elNominal, lim)
		ps[i] = policyOf(names[i], lim)
	}
	return s.elNominal[start:], headers.FormatPolicies(ps...)
}

// takeElastic decides the charges of s: first against each limit's own
// counter, and when the only charges denied are elastic ones with
// headroom open, again with those charged to their headroom's counters.
func (l *Limiter) takeElastic(ctx context.Context, now time.Time, s *scratch) (bool, error) {
	allowed, err := l.takeAt(ctx, now, s.fleet, s.charges, s.decisions, s.atp)
	if err != nil || allowed || len(s.elastic) == 0 {
		return allowed, err
	}
	s.elAlt = append(s.elAlt[:0], s.charges...)
	tried := false
	for i := range s.decisions {
		if s.decisions[i].Allowed {
			continue
		}
		e := s.elasticAt(i)
		if e == nil || e.headroom <= 0 {
			return false, nil // a limit without headroom denies
		}
		c := &s.elAlt[i]
		c.Name += elasticSuffix
		c.Limit.Requests, c.Limit.Ceiling = e.headroom, 0
		tried = true
	}
	if !tried {
		return false, nil
	}
	s.elDec = grow(s.elDec, len(s.elAlt))
	ok, err := l.take(ctx, now, s.fleet, s.elAlt, s.elDec)
	if err != nil {
		// The first answer stands: the limits' own counters denied.
		l.cfg.report(nil, err)
		return false, nil
	}
	for i := range s.decisions {
		if s.elAlt[i].Name == s.charges[i].Name {
			if ok {
				s.decisions[i] = s.elDec[i]
			}
			continue
		}
		if ok {
			s.decisions[i] = s.elDec[i]
			s.elUsed = true
		} else if d := s.elDec[i]; !d.Allowed && d.RetryAfter >= 0 && d.RetryAfter < s.decisions[i].RetryAfter {
			// Denied by both counters: the first to make room.
			s.decisions[i].RetryAfter, s.decisions[i].NextAfter = d.RetryAfter, d.NextAfter
		}
	}
	return ok, nil
}

// elasticAt returns the elastic charge at index i, if it is one.
func (s *scratch) elasticAt(i int) *elasticCharge {
	for k := range s.elastic {
		if s.elastic[k].idx == i {
			return &s.elastic[k]
		}
	}
	return nil
}
