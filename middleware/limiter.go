package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/pathmatch"
	"github.com/sluicehq/sluice/keyfunc"
)

// ErrStore wraps every error a Store returned, so error handlers can tell a
// store failure (errors.Is(err, ErrStore)) from a request without a key
// (errors.Is(err, keyfunc.ErrNoKey)).
var ErrStore = errors.New("sluice: store failed")

// Limiter decides whether requests are within their limits.
type Limiter struct {
	rules atomic.Pointer[ruleSet]
	cfg   config
	renew renewer
	// waiting counts the requests waiting for a leaky bucket's turn.
	waiting atomic.Int64
	// unmatched is the UnmatchedPolicy in force.
	unmatched atomic.Uint32
	// clients holds bans and per-client overrides (ban.go, override.go).
	clients clientState
	// ov holds the capacity signals (adaptive.go, elastic.go).
	ov        overload
	closeOnce sync.Once
	// syncs is the coordination layer of lease and write-back rules
	// (sync.go).
	syncs syncLayer
	// pauses holds the pauses of a Limiter made WithPauses (pause.go).
	pauses pauseState
}

type ruleSet struct {
	rules []*compiledRule
	// counting are the rules that count by outcome (Rule.Count).
	counting countingRules
	// banning is set when a limit has a Ban (or a rule a LimitsFunc, whose
	// limits may).
	banning bool
	// overload reports that a rule has AdaptiveConcurrency.
	overload bool
}

// New returns a Limiter that applies one limit to every request, counted per
// key. The key is required on purpose: every call site says what it limits
// by. It returns an error describing the first problem it finds in the
// configuration.
//
//	lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP())
func New(limit Limit, key keyfunc.Func, opts ...Option) (*Limiter, error) {
	return NewRules([]Rule{{Name: DefaultRuleName, Key: key, Limits: []Limit{limit}}}, opts...)
}

// DefaultRuleName is the name of the single rule New creates; it appears in
// the RateLimit and RateLimit-Policy fields.
const DefaultRuleName = "default"

// NewRules returns a Limiter that applies rules. See Rule.
func NewRules(rules []Rule, opts ...Option) (*Limiter, error) {
	l := &Limiter{cfg: defaultConfig()}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("sluice: nil Option")
		}
		o(&l.cfg)
	}
	if err := l.cfg.finish(); err != nil {
		return nil, err
	}
	l.unmatched.Store(uint32(l.cfg.unmatched))
	l.bindPauses()
	if err := l.SetRules(rules); err != nil {
		l.cfg.release()
		return nil, err
	}
	l.startClientSync()
	return l, nil
}

// SetRules replaces the limiter's rules atomically. Requests in flight finish
// under the rules they started with; counters of rules whose name and
// windows are unchanged carry on. If rules are invalid, SetRules returns an
// error and the previous rules stay in force.
func (l *Limiter) SetRules(rules []Rule) error {
	set, err := compileRules(rules)
	if err != nil {
		return err
	}
	if set.counting != nil {
		if err := l.checkRefunder(set); err != nil {
			return err
		}
	}
	if l.cfg.slots == nil {
		for _, r := range set.rules {
			if r.Concurrency > 0 {
				return fmt.Errorf("sluice: rule %q: concurrency needs a store that can hold slots (a SlotStore, such as the memory and Redis stores); %T cannot", r.Name, l.cfg.store)
			}
		}
	}
	if err := l.bindSync(set); err != nil {
		return err
	}
	if rs, ok := l.cfg.store.(*RegionStore); ok {
		rs.bindScopes(set)
	}
	l.bindOverload(set)
	l.rules.Store(set)
	return nil
}

func compileRules(rules []Rule) (*ruleSet, error) {
	if len(rules) == 0 {
		return nil, errors.New("sluice: no rules")
	}
	set := &ruleSet{}
	seen := map[string]bool{}
	for _, r := range rules {
		c, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("sluice: %w", err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("sluice: rule %q: name used twice", r.Name)
		}
		seen[r.Name] = true
		set.rules = append(set.rules, c)
	}
	set.counting = counting(set.rules)
	set.banning = banning(set.rules)
	return set, nil
}

// Close stops what the limiter started itself, for good: the renewal of
// the leases of concurrency slots, the publishing of spare capacity, and
// the stores it made (the default in-memory store and FailLocal's default
// fallback), whose goroutines have returned when Close returns. It removes
// the limiter's Observers from its stores. A store given to WithStore or
// WithFallbackStore is the caller's: Close does not close it (close it
// after the Limiter).
//
// The leases of the concurrency slots of requests still in flight, and of
// any taken after Close, are not renewed: on a shared store such slots
// are freed when their lease ends, if the requests do not end first. Close
// is idempotent and safe for concurrent use; later calls return nil.
func (l *Limiter) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.stopRenewer()
		l.stopFleet()
		l.stopClientSync()
		l.stopSync()
		err = l.cfg.release()
	})
	return err
}

// Outcome is how a request was decided, as reported to Observer.Decided
// (and so to metrics and logs).
type Outcome uint8

// The outcomes.
const (
	// OutcomeAllowed: every limit that applied admitted the request.
	OutcomeAllowed Outcome = iota + 1
	// OutcomeDenied: a limit denied the request (429, or a concurrency
	// limit's status).
	OutcomeDenied
	// OutcomeShadowDenied: a shadow rule, or the limiter in shadow mode,
	// would have denied the request, which passed.
	OutcomeShadowDenied
	// OutcomeFailedOpen: the store failed and the request passed unlimited
	// (FailOpen, or FailLocal whose fallback failed too).
	OutcomeFailedOpen
	// OutcomeFallback: the store failed and the local fallback decided
	// (FailLocal); Allowed says how.
	OutcomeFallback
	// OutcomeNoKey: a rule found no key and the request was rejected
	// (NoKeyReject).
	OutcomeNoKey
	// OutcomeError: the request could not be decided (the store failed
	// under FailClosed, or a rule's LimitsFunc returned an invalid limit).
	OutcomeError
	// OutcomeUnlimited: no rule applied.
	OutcomeUnlimited
	// OutcomeGaveUp: the request waited for its turn in a leaky bucket's
	// queue and its client went away first.
	OutcomeGaveUp
	// OutcomeUnmatched: no rule applied and the limiter denies such
	// requests (UnmatchedDeny): 503.
	OutcomeUnmatched
)

var outcomeNames = [...]string{
	OutcomeAllowed:      "allowed",
	OutcomeDenied:       "denied",
	OutcomeShadowDenied: "shadow_denied",
	OutcomeFailedOpen:   "failed_open",
	OutcomeFallback:     "fallback",
	OutcomeNoKey:        "no_key",
	OutcomeError:        "error",
	OutcomeUnlimited:    "unlimited",
	OutcomeGaveUp:       "gave_up",
	OutcomeUnmatched:    "unmatched",
}

// String returns the outcome's name as metrics label it: "allowed",
// "denied", "shadow_denied", "failed_open", "fallback", "no_key", "error",
// "unlimited", "gave_up" or "unmatched".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "unknown"
}

// Result is what Decide found for one request: whether it may proceed,
// the binding limit and where it stands (for the rate-limit headers and
// the 429), and how the request was decided (Outcome). WriteHeaders turns
// it into response headers; Done gives back the concurrency slots it
// holds.
type Result struct {
	// Allowed reports whether the request may proceed. In shadow mode it
	// is true even when a limit was exceeded; see Shadowed.
	Allowed bool
	// Applied reports whether any limit applied to the request. When it is
	// false (no rule matched, all were skipped, or the store failed and the
	// policy is to fail open) the fields of the binding limit (Policy to
	// Cost) are zero and no rate-limit headers are sent.
	Applied bool
	// Shadowed reports that a shadow rule (or the limiter, in shadow mode)
	// would have denied the request.
	Shadowed bool
	// Policy names the binding limit: the one that denied the request or,
	// when allowed, the one with the fewest requests remaining.
	Policy string
	// Limit is the binding limit, as configured (without overage).
	Limit Limit
	// Remaining is how many more requests the binding limit admits now.
	Remaining int
	// ResetAfter is how long until the binding limit is whole again; it is
	// sent as X-RateLimit-Reset.
	ResetAfter time.Duration
	// NextAfter is how long until the binding limit makes more quota
	// available: when allowed, until Remaining next grows (zero when the
	// limit is whole); when denied, until a request of cost 1 would be
	// admitted. It is sent as the t parameter of the RateLimit field.
	NextAfter time.Duration
	// RetryAfter is how long the client should wait before retrying; set
	// only when the request was denied. It is -1 when the request costs
	// more than the limit, so no wait would help.
	RetryAfter time.Duration
	// Cost is what the request was charged under the binding limit.
	Cost int
	// StoreErr is the store error that a limiter failing open, or deciding
	// with its local fallback (FailLocal), absorbed: the request was
	// decided all the same (OutcomeFailedOpen, OutcomeFallback), and Decide
	// returned no error. It wraps ErrStore. An error that left the request
	// undecided is Decide's own returned error, not StoreErr.
	StoreErr error
	// Outcome says how the request was decided; Observer.Decided sees
	// every request Decide handles, exactly once, with its Outcome.
	Outcome Outcome
	// Rule is the name of the rule of the binding limit (for a request
	// that could not be decided, of the first rule that applied).
	Rule string
	// ShadowPolicy names the limit of a shadow rule that would have denied
	// the request, when one did (Shadowed is then set).
	ShadowPolicy string
	// Concurrency reports that the request was denied by a concurrency
	// limit (Rule.Concurrency): Limit.Requests slots of Policy were all
	// held. No rate-limit headers are sent for such a denial, only
	// Retry-After (ConcurrencyRetryAfter).
	Concurrency bool
	// InFlight is, for a concurrency denial, how many requests of the key
	// were in flight.
	InFlight int
	// Delay is how long an admitted request waited for its turn in a
	// leaky bucket's queue (LeakyBucket) before Decide returned.
	Delay time.Duration
	// Banned reports that the request was denied because its client is
	// banned (Limit.Ban): RetryAfter is the time left of the ban.
	Banned bool
	// Shed reports that an adaptive concurrency limit refused the request
	// (Rule.AdaptiveConcurrency); Concurrency is set too, and Limit is the
	// threshold of the request's Priority.
	Shed bool
	// Priority is the request's priority, when an adaptive concurrency
	// limit applied to it.
	Priority Priority
	// Elastic reports that the request was admitted past its limit, on
	// the headroom an elastic limit (Limit.Ceiling) had open.
	Elastic bool
	// Paused reports that the request was denied because its key is
	// paused (Limiter.Pause): RetryAfter is the time left of the pause.
	Paused bool

	policies string
	status   int         // the status of a concurrency denial, 0 for 429
	hold     *hold       // concurrency slots to give back (Done)
	settle   *settlement // charges to give back if the response does not count (Finish)
	key      string      // the binding limit's key, for hashed logs
	blocked  bool        // denied by a Deny rule
	// prepared is the binding limit's fixed header text, if it has one.
	prepared *headerwrite.Prepared
}

// Decide rate-limits one request: it finds the rules that apply, computes
// keys and costs, and asks the store, charging the request only if every
// limit admits it. Front ends call it once per request, then WriteHeaders,
// then deny or continue.
//
// Decide returns an error when the request cannot be decided: it wraps
// keyfunc.ErrNoKey when a key function found no key (and the limiter is set
// to reject such requests), or ErrStore when the store failed and the
// failure policy is FailClosed. Decide never panics on bad input.
func (l *Limiter) Decide(r keyfunc.Request) (Result, error) {
	var res Result
	err := l.decideTo(r, &res)
	return res, err
}

// decideTo is Decide writing its Result to res, which must be zero: the
// Result, some 300 bytes, is then never copied on the way.
func (l *Limiter) decideTo(r keyfunc.Request, res *Result) error {
	err := l.decide(r, res)
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

// decide decides r into res, which must be zero. It runs the steps of a
// decision in order; each step either leaves the decision to the next or
// ends it, with res written.
func (l *Limiter) decide(r keyfunc.Request, res *Result) error {
	set := l.rules.Load()
	s := scratchPool.Get().(*scratch)
	defer s.release()

	matched, err := l.matchRules(set, r, s, res)
	if err != nil {
		return err
	}
	if s.blocked != nil {
		l.denyRule(s.blocked, res)
		return nil
	}
	oh, shed := l.admitOverload(r, s, res)
	if shed {
		return nil
	}
	defer l.settleOverload(oh, s, res)
	if len(s.charges) == 0 && len(s.shadow) == 0 && len(s.slots) == 0 {
		l.unlimited(matched, s, res)
		return nil
	}
	ctx := r.Context()
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	s.counting, s.banning = set.counting, set.banning || l.clients.overrides.n.Load() > 0
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
		if err := l.addCharges(s, rule, r); err != nil {
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
	if s.counting != nil && s.counting.any(s.charges) {
		s.atp = &s.at
	}
	allowed, err := l.takeElastic(ctx, now, s)
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
	allowed, err := l.take(ctx, now, s.shadow, s.shadowDec)
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
		if s.counting != nil && !s.at.IsZero() {
			res.settle = l.settlementFor(s.counting, s.store, s.at, s.charges)
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

// take asks the store to decide charges at now. takeAt is take for
// charges that include some of rules that count by outcome: *at is set to the
// instant the store admitted them at (zero if it did not), and denials are
// not remembered by the deny cache, since the charges of requests in
// flight may yet be given back.
func (l *Limiter) take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return l.takeAt(ctx, now, charges, out, nil)
}

// takeAt is take that, when at is not nil, also sets *at (see take).
func (l *Limiter) takeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision, at *time.Time) (bool, error) {
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
	ok, err := l.storeTake(l.cfg.store, ctx, now, charges, out, at)
	if o != nil {
		o.StoreCalled(time.Since(began), err)
	}
	if err == nil && !ok && dc != nil && at == nil {
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
		allowed, ferr := l.storeTake(l.cfg.fallback, ctx, now, s.charges, s.decisions, s.atp)
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

// addCharges appends the charges of rule for r to s.
func (l *Limiter) addCharges(s *scratch, rule *compiledRule, r keyfunc.Request) error {
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
		if len(rule.limits) == 0 && rule.LimitsFunc == nil {
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
	if rule.LimitsFunc != nil {
		prepared = nil
		var err error
		if limits, nominal, names, policy, elastic, err = rule.dynamic(r, key); err != nil {
			return err
		}
	}
	if l.clients.overrides.n.Load() > 0 {
		if cl := l.overrideFor(rule, key); cl != nil {
			limits, nominal, names, policy, prepared = cl.limits, cl.nominal, cl.names, cl.policy, cl.prepared
			elastic = false // overrides have no Ceiling
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
		*dst = append(*dst, Charge{Key: key, Name: rule.Name, Limit: lim, Cost: cost})
		m := chargeMeta{name: names[i], nominal: &nominal[i], policy: policy}
		if prepared != nil {
			m.prepared = prepared[i]
		}
		*metas = append(*metas, m)
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

// WriteHeaders sets the rate-limit fields of res on s in the limiter's
// header style. It writes nothing when no limit applied.
func (l *Limiter) WriteHeaders(s headers.Setter, res *Result) {
	if res.blocked {
		return
	}
	if res.Concurrency {
		if !res.Allowed {
			s.Set(headers.RetryAfter, strconv.FormatInt(headers.Seconds(res.RetryAfter), 10))
		}
		return
	}
	if !res.Applied || l.cfg.style == headers.None && res.Allowed {
		return
	}
	v := headerwrite.Values{
		Name:       res.Policy,
		Limit:      res.Limit.Capacity(),
		Remaining:  res.Remaining,
		Reset:      res.ResetAfter,
		Next:       res.NextAfter,
		RetryAfter: res.RetryAfter,
		Policy:     res.policies,
	}
	if res.Allowed {
		v.RetryAfter = 0
	}
	headerwrite.Write(s, headerwrite.Style(l.cfg.style), &v, res.prepared)
}

// Handler returns middleware that rate-limits next: requests within their
// limits reach next with rate-limit headers set; denied requests get the
// deny handler (429 by default); requests that cannot be decided get the
// error handler.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.cfg.skip != nil && l.cfg.skip(r) {
			next.ServeHTTP(w, r)
			return
		}
		var res Result
		if err := l.decideTo(keyfunc.FromHTTP(r), &res); err != nil {
			l.cfg.onError(w, r, err)
			return
		}
		l.WriteHeaders(w.Header(), &res)
		if !res.Allowed {
			denied := res // a copy, so that res itself stays on the stack
			l.cfg.deny.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resultKey, &denied)))
			return
		}
		if res.settle != nil {
			l.serveCounted(w, r, next, &res)
			return
		}
		if res.hold != nil {
			// Given back when next returns, panics included.
			defer res.Done()
		}
		next.ServeHTTP(w, r)
	})
}

// HandlerFunc is Handler for a handler function.
func (l *Limiter) HandlerFunc(next http.HandlerFunc) http.Handler { return l.Handler(next) }

type contextKey struct{ name string }

// resultKey is a pointer so that it fits in an interface without allocating.
var resultKey = &contextKey{"result"}

// ResultFromContext returns the Result of a denied request; deny handlers
// given to WithDenyHandler read it to build their response.
func ResultFromContext(ctx context.Context) (Result, bool) {
	res, ok := ctx.Value(resultKey).(*Result)
	if !ok {
		return Result{}, false
	}
	return *res, true
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
	overloadScratch
}

// chargeMeta is what the result needs about each charge beyond the Store's
// view of it.
type chargeMeta struct {
	name     string
	nominal  *Limit // the rule's own, never written to
	policy   string
	prepared *headerwrite.Prepared // nil for a LimitsFunc's limits
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{
		charges:   make([]Charge, 0, 4),
		decisions: make([]Decision, 0, 4),
		metas:     make([]chargeMeta, 0, 4),
	}
}}

func (s *scratch) release() {
	clear(s.charges)
	clear(s.shadow)
	clear(s.metas)
	clear(s.shadowMetas)
	clear(s.slots)
	s.slots = s.slots[:0]
	s.blocked, s.shadowBlocked = nil, nil
	s.at, s.atp, s.store, s.counting, s.banning = time.Time{}, nil, nil, nil, false
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

// result folds the decisions of one store call into res, which must be
// zero but for Allowed: the binding limit is the denying one with the
// longest wait or, when allowed, the one with the fewest requests
// remaining.
func (s *scratch) result(res *Result, allowed bool, charges []Charge, ds []Decision, metas []chargeMeta) {
	res.Allowed, res.Applied = allowed, true
	best := -1
	for i := range ds {
		d := &ds[i]
		rem := nominalRemaining(d.Remaining, &charges[i].Limit, metas[i].nominal)
		switch {
		case best < 0:
		case !allowed:
			if d.Allowed || (!ds[best].Allowed && !longerWait(d.RetryAfter, ds[best].RetryAfter)) {
				continue
			}
		case rem > res.Remaining || rem == res.Remaining && d.ResetAfter <= res.ResetAfter:
			continue
		}
		best = i
		res.Policy, res.Limit, res.Remaining, res.Rule, res.key = metas[i].name, *metas[i].nominal, rem, charges[i].Name, charges[i].Key
		res.prepared = metas[i].prepared
		res.ResetAfter, res.RetryAfter, res.NextAfter, res.Cost = d.ResetAfter, d.RetryAfter, d.NextAfter, charges[i].Cost
	}
	if allowed {
		res.RetryAfter = 0
		for i := range ds {
			res.Delay = max(res.Delay, ds[i].Delay)
		}
	}
	res.policies = metas[0].policy
	for i := 1; i < len(metas); i++ {
		if metas[i].policy != metas[i-1].policy {
			res.policies = joinPolicies(metas)
			break
		}
	}
}

// longerWait orders retry delays, -1 (never) being the longest.
func longerWait(a, b time.Duration) bool {
	if a < 0 || b < 0 {
		return a < 0 && b >= 0
	}
	return a > b
}

// nominalRemaining reports remaining requests against the nominal limit when
// a rule allows overage: the overage is not advertised.
func nominalRemaining(rem int, eff, nominal *Limit) int {
	if extra := eff.Capacity() - nominal.Capacity(); extra > 0 {
		rem = max(rem-extra, 0)
	}
	return rem
}

func joinPolicies(metas []chargeMeta) string {
	var b []byte
	for i, m := range metas {
		if i > 0 && m.policy == metas[i-1].policy {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(b, m.policy...)
	}
	return string(b)
}
