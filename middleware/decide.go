package middleware

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/arena"
	"github.com/sluicehq/sluice/internal/fleetstore"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/pathmatch"
	"github.com/sluicehq/sluice/keyfunc"
)

// decideTo is Decide writing its Result to res, which must be zero: the
// Result, some 300 bytes, is then never copied on the way.
func (l *Limiter) decideTo(r keyfunc.Request, res *Result) error {
	s := scratchPool.Get().(*scratch)
	err := l.decideIn(s, r, res)
	s.release()
	return err
}

// decideIn is decideTo with the scratch s, which the caller gives back
// (after using its arena, as Handler does for the headers).
func (l *Limiter) decideIn(s *scratch, r keyfunc.Request, res *Result) error {
	err := l.decide(s, r, res)
	if err != nil {
		switch {
		case res.Outcome != 0:
		case errors.Is(err, keyfunc.ErrNoKey):
			res.Outcome = OutcomeNoKey
		default:
			res.Outcome = OutcomeError
		}
	}
	if l.cfg.obs != nil {
		l.cfg.decided(r, res)
	}
	return err
}

// decide decides r into res, which must be zero, with the scratch s. It
// runs the steps of a decision in order (decideWith); each step either
// leaves the decision to the next or ends it, with res written. A
// capability that no rule in force uses is no step at all: the ruleSet's
// flags, fixed when the rules were set, skip it without a lock, a map
// lookup or an atomic operation. Its last step notes the decision for the
// top clients.
func (l *Limiter) decide(s *scratch, r keyfunc.Request, res *Result) error {
	set := l.rules.Load()
	s.fleet = set.fleet
	err := l.decideWith(set, r, s, res)
	if t := l.top.t; t != nil && res.Applied {
		l.noteTop(t, s, res)
	}
	return err
}

// decideWith is decide with the rules in force and a scratch.
func (l *Limiter) decideWith(set *ruleSet, r keyfunc.Request, s *scratch, res *Result) error {
	matched, err := l.matchRules(set, r, s, res)
	if err != nil {
		return err
	}
	if s.blocked != nil {
		l.denyRule(s.blocked, res)
		return nil
	}
	if !set.overload && (!set.signals || l.ov.measured() == nil) {
		return l.decideLimits(set, matched, r, s, res)
	}
	oh, shed := l.admitOverload(r, s, res)
	if shed {
		return nil
	}
	defer l.settleOverload(oh, s, res)
	return l.decideLimits(set, matched, r, s, res)
}

// decideLimits is the part of decideWith after overload protection: the
// request's bans and pauses, its concurrency slots, its charges and its
// turn in a queue.
func (l *Limiter) decideLimits(set *ruleSet, matched bool, r keyfunc.Request, s *scratch, res *Result) error {
	if len(s.charges) == 0 && len(s.shadow) == 0 && len(s.slots) == 0 {
		l.unlimited(matched, s, res)
		return nil
	}
	ctx := r.Context()
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	s.counting, s.banning = set.counting, set.banning || set.overrides
	if s.banning && !l.cfg.shadow && len(s.charges) > 0 && l.banned(ctx, now, r, s) {
		s.result(res, false, s.charges, s.decisions, s.metas)
		res.Banned, res.Outcome = true, OutcomeDenied
		return nil
	}
	if l.cfg.pauses && !l.cfg.shadow && len(s.charges) > 0 && l.paused(ctx, now, r, s) {
		s.result(res, false, s.charges, s.decisions, s.metas)
		res.Paused, res.Outcome = true, OutcomeDenied
		return nil
	}
	res.Allowed = true // res is zero
	var d decision
	if len(s.slots) > 0 {
		if done, err := l.takeSlots(ctx, now, r, s, res, &d); done {
			return err
		}
	}
	if len(s.charges) > 0 {
		if done, err := l.charge(ctx, now, r, s, res, &d); done {
			return err
		}
	}
	if res.Delay > 0 && !l.cfg.shadow {
		if err := l.waitTurn(ctx, now, r, s, res, &d); err != nil {
			return err
		}
	}
	if len(s.shadow) > 0 && res.Allowed {
		l.chargeShadow(ctx, now, r, s, res)
	}
	l.outcome(s, res, &d)
	if res.settle != nil {
		res.settle.ctx = ctx
	}
	return nil
}

// decision is what the steps of decide hand on to each other beyond the
// Result.
type decision struct {
	// hold is the concurrency slots the request took, nil if none.
	hold *hold
	// slotShadowed reports that a shadow concurrency limit had no free
	// slot.
	slotShadowed bool
}

// matchRules is the first step of decide: it finds the rules that apply
// to r and adds their charges, slots and Deny rules to s. It reports
// whether any rule matched (skipped or not). A rule whose key or limits
// cannot be computed ends the decision with its error, and res names the
// rule.
func (l *Limiter) matchRules(set *ruleSet, r keyfunc.Request, s *scratch, res *Result) (matched bool, err error) {
	method, p := r.Method(), ""
	for _, rule := range set.rules {
		if !rule.match.All || rule.methods != 0 || len(rule.other) > 0 {
			if p == "" {
				p = pathmatch.Clean(r.Path())
			}
			if !rule.matches(method, p) {
				continue
			}
		}
		if rule.extra && !rule.matchesExtra(r) {
			continue
		}
		matched = true
		if rule.Skip != nil && rule.Skip(r) {
			continue
		}
		if rule.overloadRule && s.noteOverload(rule) {
			continue
		}
		if err := l.addCharges(s, rule, r, set.overrides); err != nil {
			if errors.Is(err, keyfunc.ErrNoKey) && l.cfg.noKey == NoKeyAllow {
				continue
			}
			*res = Result{Rule: rule.Name}
			return matched, err
		}
	}
	return matched, nil
}

// denyRule decides a request that a Deny rule b turns away: nothing is
// charged, and no slot was taken yet.
func (l *Limiter) denyRule(b *compiledRule, res *Result) {
	*res = Result{Policy: b.Name, Rule: b.Name, RetryAfter: -1, blocked: true, Outcome: OutcomeDenied}
	if l.cfg.shadow {
		res.Allowed, res.Shadowed, res.RetryAfter, res.Outcome = true, true, 0, OutcomeShadowDenied
	}
}

// unlimited decides a request that no limit applies to: unmatched (and
// denied if the limiter denies such requests), or allowed.
func (l *Limiter) unlimited(matched bool, s *scratch, res *Result) {
	switch {
	case !matched && l.unmatched.Load() == uint32(UnmatchedDeny):
		*res = l.unmatchedResult()
	case s.shadowBlocked != nil:
		*res = Result{Allowed: true, Shadowed: true, ShadowPolicy: s.shadowBlocked.Name, Outcome: OutcomeShadowDenied}
	default:
		*res = Result{Allowed: true, Outcome: OutcomeUnlimited}
	}
}

// takeSlots takes a slot of every concurrency limit of the request,
// before any rate limit: a request a concurrency limit turns away is
// charged to no rate limit. It reports done when that ends the decision:
// a denial, or a store failure under FailClosed (err).
func (l *Limiter) takeSlots(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, res *Result, d *decision) (done bool, err error) {
	h, denied, shadowed, err := l.acquire(ctx, now, r, s.slots)
	if err != nil {
		*res = Result{}
		return true, err
	}
	if denied != nil {
		denied.Outcome = OutcomeDenied
		*res = *denied
		return true, nil
	}
	d.hold, d.slotShadowed = h, shadowed
	return false, nil
}

// charge asks the store to decide the request's charges and folds its
// decisions into res. When the store fails, the failure policy decides;
// charge reports done when that ends the decision (the request failed
// open, or could not be decided: err).
func (l *Limiter) charge(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, res *Result, d *decision) (done bool, err error) {
	s.decisions = grow(s.decisions, len(s.charges))
	var fleetUsage *fleetstore.Store
	switch {
	case s.counting != nil && s.counting.any(s.charges):
		s.atp = &s.at
	case s.usage:
		// Usage limits in lease or write-back mode settle through the
		// coordination layer (settleThroughFleet); the others exactly.
		if fleetUsage = s.fleet; fleetUsage == nil {
			s.atp = &s.at
		}
	}
	allowed, err := l.takeElastic(ctx, now, s)
	if err == nil && !allowed && s.usage {
		allowed = l.retryUsage(ctx, now, s)
	}
	if fleetUsage != nil && (allowed || err != nil) {
		defer l.settleThroughFleet(fleetUsage, now, s)
	}
	if err == nil {
		if !allowed && s.banning && !l.cfg.shadow {
			res.Banned = l.startBans(ctx, now, r, s)
		}
		s.result(res, allowed, s.charges, s.decisions, s.metas)
		return false, nil
	}
	*res, err = l.storeFailed(ctx, now, r, s, err)
	if err == nil && res.Applied {
		return false, nil // the local fallback decided
	}
	if err != nil || !res.Allowed {
		d.hold.releaseNow()
	} else {
		res.hold = d.hold
	}
	res.Shadowed = res.Shadowed || d.slotShadowed
	return true, err
}

// waitTurn holds a request that a leaky bucket admitted with a Delay until
// its turn. A client that goes away first ends the decision (OutcomeGaveUp)
// with the error.
func (l *Limiter) waitTurn(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, res *Result, d *decision) error {
	if err := l.wait(ctx, now, r, s, res); err != nil {
		d.hold.releaseNow()
		res.Outcome = OutcomeGaveUp
		return err
	}
	return nil
}

// chargeShadow charges an allowed request to the shadow rules, which
// deny nothing: res only notes that one would have denied (Shadowed). A
// request the enforced rules deny is charged to no rule, shadow rules
// included.
func (l *Limiter) chargeShadow(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, res *Result) {
	s.shadowDec = grow(s.shadowDec, len(s.shadow))
	allowed, err := l.take(ctx, now, s.fleet, s.shadow, s.shadowDec)
	if err != nil {
		l.cfg.report(r, err)
	} else if !allowed {
		var shadow Result
		s.result(&shadow, false, s.shadow, s.shadowDec, s.shadowMetas)
		res.Shadowed = true
		res.ShadowPolicy = shadow.Policy
	}
}

// outcome is the last step of decide: shadow mode lets a denied request
// through, the request keeps its concurrency slots if it proceeds (and
// gives them back if not), and res gets its Outcome.
func (l *Limiter) outcome(s *scratch, res *Result, d *decision) {
	if l.cfg.shadow && !res.Allowed {
		res.Allowed, res.Shadowed = true, true
		res.RetryAfter = 0
	}
	res.Shadowed = res.Shadowed || d.slotShadowed
	if s.shadowBlocked != nil && res.Allowed && !res.Shadowed {
		res.Shadowed, res.ShadowPolicy = true, s.shadowBlocked.Name
	}
	if res.Allowed {
		res.hold = d.hold
		if (s.counting != nil || s.usage) && !s.at.IsZero() {
			res.settle = l.settlementFor(s.counting, s.store, s.at, s.charges, s.metas)
		}
	} else {
		d.hold.releaseNow()
	}
	if res.Outcome == 0 {
		switch {
		case !res.Allowed:
			res.Outcome = OutcomeDenied
		case res.Shadowed:
			res.Outcome = OutcomeShadowDenied
		default:
			res.Outcome = OutcomeAllowed
		}
	}
}

// take asks the store to decide charges at now, through fs, the
// coordination layer of lease and write-back rules, when it is not nil
// (ruleSet.fleet). takeAt is take for charges that include some of rules
// that count by outcome: *at is set to the instant the store admitted them
// at (zero if it did not), and denials are not remembered by the deny
// cache, since the charges of requests in flight may yet be given back.
func (l *Limiter) take(ctx context.Context, now time.Time, fs *fleetstore.Store, charges []Charge, out []Decision) (bool, error) {
	return l.takeAt(ctx, now, fs, charges, out, nil)
}

// takeAt is take that, when at is not nil, also sets *at (see take).
func (l *Limiter) takeAt(ctx context.Context, now time.Time, fs *fleetstore.Store, charges []Charge, out []Decision, at *time.Time) (bool, error) {
	dc := l.cfg.denyCache
	var local time.Time
	if dc != nil {
		// The instant read before the store is asked: an entry then
		// expires no later than the store's own RetryAfter would.
		local = now
		if local.IsZero() {
			local = time.Now()
		}
		if i, d, ok := dc.Lookup(local, internalCharges(charges)); ok {
			// The store would deny too. The other charges were not
			// decided; they are reported as not binding.
			for j := range out {
				out[j] = Decision{Allowed: true}
			}
			out[i] = Decision(d)
			if o := l.cfg.obs; o != nil {
				o.DenyCacheHit(charges[i].Name)
			}
			yieldSometimes()
			return false, nil
		}
	}
	b := l.cfg.breaker
	if b != nil && !b.allow() {
		return false, errBreakerOpen
	}
	var began time.Time
	o := l.cfg.obs
	if o != nil {
		began = time.Now()
	}
	ok, err := l.storeTake(l.cfg.store, fs, ctx, now, charges, out, at)
	if o != nil {
		o.StoreCalled(time.Since(began), err)
	}
	if err == nil && !ok && dc != nil && at == nil && !anyUsage(charges) {
		dc.Record(local, internalCharges(charges), internalDecisions(out))
	}
	if err != nil {
		if b != nil {
			b.failure()
		}
		return false, fmt.Errorf("%w: %w", ErrStore, err)
	}
	if b != nil {
		b.success()
	}
	return ok, nil
}

// storeFailed applies the failure policy to a store error. s still holds
// the request's charges, so a local fallback can decide them.
func (l *Limiter) storeFailed(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, err error) (Result, error) {
	if !errors.Is(err, ErrBreakerOpen) { // BreakerChanged reports those
		l.cfg.report(r, err)
	}
	switch l.cfg.failure {
	case FailClosed:
		return Result{Outcome: OutcomeError, Rule: s.charges[0].Name}, err
	case FailLocal:
		allowed, ferr := l.storeTake(l.cfg.fallback, nil, ctx, now, s.charges, s.decisions, s.atp)
		s.store = l.cfg.fallback
		if ferr == nil {
			var res Result
			s.result(&res, allowed, s.charges, s.decisions, s.metas)
			res.StoreErr, res.Outcome = err, OutcomeFallback
			return res, nil
		}
		l.cfg.report(r, fmt.Errorf("%w: fallback: %w", ErrStore, ferr))
	}
	return Result{Allowed: true, StoreErr: err, Outcome: OutcomeFailedOpen, Rule: s.charges[0].Name}, nil
}

// addCharges appends the charges of rule for r to s; overrides says
// whether any client has an override (ruleSet.overrides).
func (l *Limiter) addCharges(s *scratch, rule *compiledRule, r keyfunc.Request, overrides bool) error {
	key, err := rule.Key(r)
	if err != nil {
		return fmt.Errorf("sluice: rule %q: %w", rule.Name, err)
	}
	if key == "" {
		return fmt.Errorf("sluice: rule %q: empty key: %w", rule.Name, keyfunc.ErrNoKey)
	}
	if rule.allowed(key) {
		return nil
	}
	if rule.Deny {
		switch {
		case !rule.Shadow:
			if s.blocked == nil {
				s.blocked = rule
			}
		case s.shadowBlocked == nil:
			s.shadowBlocked = rule
		}
		return nil
	}
	if rule.Concurrency > 0 {
		s.slots = append(s.slots, slotRequest{rule: rule, key: key, shadow: rule.Shadow})
		if len(rule.limits) == 0 && rule.LimitsFunc == nil && rule.usage == nil {
			return nil
		}
	}
	cost := rule.Cost
	if rule.CostFunc != nil {
		cost = rule.CostFunc(r)
	}
	cost = max(cost, 1)
	limits, nominal, names, policy, prepared := rule.limits, rule.nominal, rule.names, rule.policy, rule.prepared
	elastic := rule.elastic
	exact := false
	if rule.LimitsFunc != nil {
		prepared = nil
		var err error
		if limits, nominal, names, policy, elastic, err = rule.dynamic(r, key); err != nil {
			return err
		}
	}
	if overrides {
		if cl := l.overrideFor(rule, key); cl != nil {
			limits, nominal, names, policy, prepared = cl.limits, cl.nominal, cl.names, cl.policy, cl.prepared
			elastic = false // overrides have no Ceiling
			exact = cl.exact
		}
	}
	if elastic && !rule.Shadow {
		nominal, policy = l.elasticLimits(s, len(s.charges), nominal, names)
		prepared = nil
	}
	dst, metas := &s.charges, &s.metas
	if rule.Shadow {
		dst, metas = &s.shadow, &s.shadowMetas
	}
	for i, lim := range limits {
		*dst = append(*dst, Charge{Key: key, Name: rule.Name, Limit: lim, Cost: cost, exact: exact})
		m := chargeMeta{name: names[i], nominal: &nominal[i], policy: policy, top: rule.top}
		if prepared != nil {
			m.prepared = prepared[i]
		}
		*metas = append(*metas, m)
	}
	if rule.usage != nil {
		s.addUsage(rule.usage, key, r, rule.top)
	}
	return nil
}

// dynamic computes the limits of a rule with a LimitsFunc.
func (c *compiledRule) dynamic(r keyfunc.Request, key string) (limits, nominal []Limit, names []string, policy string, elastic bool, err error) {
	// A copy: the charges' metadata points into it until the result is
	// made, and a LimitsFunc may reuse the slice it returns.
	nominal = append([]Limit(nil), c.LimitsFunc(r, key)...)
	ps := make([]headers.Policy, len(nominal))
	for i, lim := range nominal {
		if err := lim.Validate(); err != nil {
			return nil, nil, nil, "", false, fmt.Errorf("sluice: rule %q: LimitsFunc: %v", c.Name, err)
		}
		if !c.Count.IsZero() {
			if err := refundable(lim); err != nil {
				return nil, nil, nil, "", false, fmt.Errorf("sluice: rule %q: LimitsFunc: %v", c.Name, err)
			}
		}
		if err := validateCeiling(lim); err != nil {
			return nil, nil, nil, "", false, fmt.Errorf("sluice: rule %q: LimitsFunc: %v", c.Name, err)
		}
		elastic = elastic || lim.Ceiling > 0
		for _, prev := range nominal[:i] {
			if windowName(prev) == windowName(lim) {
				return nil, nil, nil, "", false, fmt.Errorf("sluice: rule %q: LimitsFunc: two limits with window %s; one limit per window", c.Name, windowName(lim))
			}
		}
		eff, err := withOverage(lim, c.Overage)
		if err != nil {
			return nil, nil, nil, "", false, fmt.Errorf("sluice: rule %q: LimitsFunc: %v", c.Name, err)
		}
		limits = append(limits, eff)
		names = append(names, policyName(c.Name, lim, len(nominal)))
		ps[i] = policyOf(names[i], lim)
	}
	return limits, nominal, names, headers.FormatPolicies(ps...), elastic, nil
}

// scratch holds the per-request buffers, pooled so that a decision on an
// existing key allocates nothing.
type scratch struct {
	charges, shadow      []Charge
	decisions, shadowDec []Decision
	metas, shadowMetas   []chargeMeta
	slots                []slotRequest
	// blocked and shadowBlocked are the first Deny rules that applied.
	blocked, shadowBlocked *compiledRule
	// at is the instant the store admitted the charges at, when some
	// count by outcome, and store the store that did.
	at    time.Time
	atp   *time.Time
	store Store
	// counting are the rules that count by outcome, and banning is set
	// when a limit may ban (or an override applies): the ruleSet's, for
	// the steps of decide.
	counting countingRules
	banning  bool
	// usage is set when a charge is of a usage limit (Rule.Usage);
	// usageAlt and usageDec are retryUsage's.
	usage    bool
	usageAlt []Charge
	usageDec []Decision
	overloadScratch
	// fleet is the coordination layer of lease and write-back rules, nil
	// if no rule in force needs it (ruleSet.fleet).
	fleet *fleetstore.Store
	// arena carves the request's keys and header values (Handler), sparing
	// trips to the arenas' pool; it stays with the scratch. view is
	// Handler's view of the request, which carries it.
	arena arena.Arena
	view  httpView
	// topShard is the shard of the top-client tracker's ring this scratch
	// puts its events in (from 1; 0 until it first does), and rng its
	// draws for the tracker's sampling gates.
	topShard uint32
	rng      hitters.Rand
}

// chargeMeta is what the result needs about each charge beyond the Store's
// view of it.
type chargeMeta struct {
	name     string
	nominal  *Limit // the rule's own, never written to
	policy   string
	prepared *headerwrite.Prepared // nil for a LimitsFunc's limits
	// usage is the rule's Usage for a usage limit's charge, and estimate
	// the request's estimate on it.
	usage    *compiledUsage
	estimate int
	// top is the sampling gates of the charge's rule (nil if untracked).
	top *hitters.Gates
}

var scratchPool = sync.Pool{New: func() any {
	s := &scratch{
		charges:   make([]Charge, 0, 4),
		decisions: make([]Decision, 0, 4),
		metas:     make([]chargeMeta, 0, 4),
	}
	s.rng.Seed()
	return s
}}

// release clears s and gives it back to the pool.
func (s *scratch) release() {
	clear(s.charges)
	clear(s.shadow)
	clear(s.metas)
	clear(s.shadowMetas)
	clear(s.slots)
	s.slots = s.slots[:0]
	s.blocked, s.shadowBlocked = nil, nil
	s.at, s.atp, s.store, s.counting, s.banning, s.fleet = time.Time{}, nil, nil, nil, false, nil
	s.view = httpView{}
	s.usage = false
	clear(s.usageAlt)
	s.overloadScratch.reset()
	s.charges, s.shadow = s.charges[:0], s.shadow[:0]
	s.metas, s.shadowMetas = s.metas[:0], s.shadowMetas[:0]
	scratchPool.Put(s)
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// storeTake asks store to decide charges at now, with TakeAt when at is
// not nil (see take), through fs when it is not nil (rules in lease or
// write-back mode, sync.go).
func (l *Limiter) storeTake(store Store, fs *fleetstore.Store, ctx context.Context, now time.Time, charges []Charge, out []Decision, at *time.Time) (bool, error) {
	if at == nil && fs != nil {
		return fs.Take(ctx, now, internalCharges(charges), internalDecisions(out))
	}
	if at == nil {
		if m, ok := store.(*MemoryStore); ok {
			// The charges of rules, checked when they were compiled.
			return m.takeValid(ctx, now, charges, out)
		}
		return store.Take(ctx, now, charges, out)
	}
	rf, ok := store.(Refunder)
	if !ok {
		return store.Take(ctx, now, charges, out)
	}
	allowed, when, err := rf.TakeAt(ctx, now, charges, out)
	if err == nil && allowed {
		*at = when
	}
	return allowed, err
}
