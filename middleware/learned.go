package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/learn"
)

// Learning the real limit of an upstream (the outbound transport,
// adapters/outbound, reports what each answer says with Limiter.Learn).
//
// A budget (a rule's limits, or its usage limits, for one key) may be
// lowered below the limits in force (the rule's, or a client's override)
// by what the Limiter learned of the upstream: the quota it announces,
// less a margin for the spread between admission and arrival, and a
// fraction, shared by the fleet through the store, that refusals lower
// and time raises again (package internal/learn has the arithmetic). The
// learned limits apply to this Limiter's decisions as an override would,
// never above the limits in force, and never past the store: each process
// computes them from the fleet's shared fraction and its own view of the
// upstream's answers.

// Evidence is what one answer of an upstream said of the budget of a
// rule for one key (Limiter.Learn): the quota it announced, how long the
// answer took, whether it refused the request.
type Evidence struct {
	// Rule is the rule and Key the key of the budget, as the request's
	// Result names them (Result.Rule, Result.Key).
	Rule, Key string
	// Usage reports that the evidence is of the rule's usage limits
	// (Rule.Usage: tokens), not of its limits.
	Usage bool
	// Quotas are the quotas the upstream announced; none when it
	// announced none.
	Quotas []Quota
	// Margin is how many units the budget keeps below each quota: 0
	// measures it (learn.Margin: one, plus what the spread of the
	// answers' durations moves across a window's edge), a negative
	// Margin keeps none.
	Margin int
	// Answered is how long after its admission the request's answer
	// came, 0 when unknown: the spread of these durations sets the
	// margin kept below a quota (learn.Margin).
	Answered time.Duration
	// Refused reports that the upstream refused the request, which the
	// Limiter admitted at Admitted.
	Refused  bool
	Admitted time.Time
}

// Quota is a quota an upstream announced: Units per Window. Window is 0
// when the upstream did not say: the quota is then taken to be per the
// window of each limit.
type Quota struct {
	Units  int64
	Window time.Duration
}

// Learned is what a Limiter learned of the budget of a rule for one key
// (Limiter.Learned, Limiter.Learn).
type Learned struct {
	// Rule and Key name the budget; Unit is "requests" for the rule's
	// limits, the usage's Unit for its usage limits.
	Rule, Key, Unit string
	// Limits are the limits in force now: Configured (the rule's, or the
	// client's override), each lowered to what was learned.
	Limits, Configured []Limit
	// Pace is the token bucket that spends a lowered budget of requests
	// evenly, beside Limits (see Learn); the zero Limit when there is
	// none.
	Pace Limit
	// Quotas are the quotas the upstream last announced (none when it
	// announced none for a minute), and Margins the units kept below
	// each.
	Quotas  []Quota
	Margins []int64
	// Spread is the spread of the answers' durations the margin covers.
	Spread time.Duration
	// Fraction is the fleet's learned fraction (1 when never cut), Cuts
	// how many refusals cut it, CutAt when the last did.
	Fraction float64
	Cuts     int64
	CutAt    time.Time
	// Cut reports, from Learn, that this evidence cut the fraction.
	Cut bool
}

// The bounds of learning.
const (
	// learnRefresh is how often a Limiter reads the fleet's learned
	// fraction of a budget it is learning, in a shared store: a cut made
	// by one process applies in every other within it (plus a round
	// trip).
	learnRefresh = 250 * time.Millisecond
	// quotaFor is how long a quota the upstream announced holds once it
	// is no longer announced.
	quotaFor = time.Minute
	// learnLife is how long, in time units of the budget (learn.Tau), the
	// fleet keeps a fraction after its last cut: long after the fraction
	// is back at 1 (at most K + 71 τ).
	learnLife = 100
	// maxLearned bounds the budgets a Limiter learns; past it, it drops
	// those it has heard nothing of for a while, or else all.
	maxLearned = 10_000
	// paceWindow is the longest window of a budget whose learned limit is
	// spent evenly (pacer).
	paceWindow = time.Second
)

// ErrNotLearnable is returned by Learn for a budget whose limits are
// computed per request (Rule.LimitsFunc), or a usage evidence of a rule
// without usage limits.
var ErrNotLearnable = errors.New("sluice: nothing to learn for this budget")

// learnStore is implemented by stores that keep the learned fractions for
// a whole fleet: the Redis store.
type learnStore interface {
	learned(ctx context.Context, now time.Time, name, key string, p *learn.Proposal, ago, ttl time.Duration) (learn.State, int64, bool, error)
}

var _ learnStore = (*RedisStore)(nil)

func (r *RedisStore) learned(ctx context.Context, now time.Time, name, key string, p *learn.Proposal, ago, ttl time.Duration) (learn.State, int64, bool, error) {
	return r.s.Learned(ctx, now, name, key, p, ago, ttl)
}

// learnedID names a budget: the rule and key, and whether it is the
// rule's usage.
type learnedID struct {
	rule, key string
	usage     bool
}

// learnedTable holds the budgets a Limiter learns. Decisions read it
// without a lock but that of the map.
type learnedTable struct {
	mu sync.RWMutex
	n  atomic.Int64
	m  map[learnedID]*learnedBudget
	// lim is the Limiter whose table it is (for its clock), set by its
	// first Learn.
	lim atomic.Pointer[Limiter]
}

// learnedBudget is one budget's learning: what decisions read (view), and
// what Learn keeps up to date under mu.
type learnedBudget struct {
	view atomic.Pointer[learnedView]
	// compiled caches the compiled limits of the last learned limits
	// (rules), or the limits themselves (usage).
	compiled atomic.Pointer[learnedCompiled]

	mu        sync.Mutex
	tau       time.Duration
	spread    learn.Spread
	margin    int // Evidence.Margin
	quotas    []Quota
	quotaTill time.Time
	// guard: a refusal of a request admitted before it is not counted
	// (the quota fell then, or the budget was first heard of then).
	guard time.Time
	// answers and refusals in the current and previous time unit.
	unit           time.Time
	answers, refus [2]int
	// read is when the fleet's fraction was last read; reading reports
	// that a read is under way.
	read    time.Time
	reading bool
	// heard is when the budget was last heard of; reported the limit
	// last reported to the observers.
	heard    time.Time
	reported int
}

// learnedView is what decisions read of a budget: immutable.
type learnedView struct {
	state     learn.State
	offset    time.Duration // the store's clock less this Limiter's
	quotas    []Quota
	margins   []int64
	quotaTill time.Time
	tau       time.Duration
}

// learnedCompiled is the cache of a budget's learned limits.
type learnedCompiled struct {
	rule   *compiledRule
	base   *compiledLimits // the override they lower, nil for the rule's
	ns     []int           // the Requests of each
	burst  int             // the pacer's least burst
	cl     *compiledLimits // rules
	limits []Limit         // usage
}

// get returns the budget id, nil if it is not learned.
func (t *learnedTable) get(id learnedID) *learnedBudget {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.RLock()
	b := t.m[id]
	t.mu.RUnlock()
	return b
}

// budget returns the budget id, made if new; ok is false when it is new
// and the table is full of budgets heard of lately.
func (t *learnedTable) budget(id learnedID, now time.Time, others *atomic.Int64) *learnedBudget {
	if b := t.get(id); b != nil {
		return b
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.m[id]; b != nil {
		return b
	}
	if t.m == nil {
		t.m = map[learnedID]*learnedBudget{}
	}
	if len(t.m) >= maxLearned {
		for k, b := range t.m {
			b.mu.Lock()
			idle := now.Sub(b.heard) > learnLife*b.tau
			b.mu.Unlock()
			if idle {
				delete(t.m, k)
			}
		}
		if len(t.m) >= maxLearned {
			clear(t.m)
		}
	}
	b := &learnedBudget{guard: now}
	t.m[id] = b
	t.n.Store(int64(len(t.m)))
	others.Store(int64(len(t.m)))
	return b
}

// list returns the budgets, by rule, key and usage.
func (t *learnedTable) list() []learnedEntry {
	t.mu.RLock()
	out := make([]learnedEntry, 0, len(t.m))
	for id, b := range t.m {
		out = append(out, learnedEntry{id, b})
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b learnedEntry) int {
		switch {
		case a.id.rule != b.id.rule:
			return cmpString(a.id.rule, b.id.rule)
		case a.id.key != b.id.key:
			return cmpString(a.id.key, b.id.key)
		case a.id.usage != b.id.usage:
			if a.id.usage {
				return 1
			}
			return -1
		}
		return 0
	})
	return out
}

type learnedEntry struct {
	id learnedID
	b  *learnedBudget
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Learn takes what an upstream's answer said of the budget of e.Rule for
// e.Key, and returns what the Limiter learned of it. The outbound
// transport (adapters/outbound) calls it for each answer; a program with
// its own client may too.
//
//   - A quota (Evidence.Quota) caps the budget's limits at the quota,
//     scaled to each limit's window, less a margin of
//     learn.Margin(quota, window, spread) units: one, plus what the
//     spread of the answers' durations (Evidence.Answered) moves across a
//     window's edge. A quota no longer announced for a minute lapses.
//   - A refusal (Evidence.Refused) of a request admitted at least a time
//     unit τ (learn.Tau: the limit's window, between 1 s and 1 min) after
//     the last cut, and after the quota last fell, cuts the fleet's
//     learned fraction (learn.State.Cut): with a shared store, one
//     atomic script call, and only one process's cut applies to one
//     episode of refusals. Every limit of the budget is then its ceiling
//     times the fraction, which recovers along a cubic curve (package
//     internal/learn states the times and the refusals it costs).
//   - With a shared store, the fleet's fraction is read at most every
//     250ms per budget: a cut made by one process applies in every other
//     within that (plus a round trip).
//
// The learned limits apply to the Limiter's decisions at once, as an
// override would (Override), for this Limiter: never above the limits in
// force, and never written to the store but the fraction. Learn reports
// to the observers (Observer.Outbound) the changes of the learned limit
// (OutboundLearned) and the cuts (OutboundCut). It returns an error for
// an unknown rule (ErrUnknownRule), an empty key, a rule whose limits are
// computed per request or a usage evidence of a rule without usage
// (ErrNotLearnable), or a store failure (wrapping ErrStore), after which
// the Limiter goes on with the fraction it knew.
func (l *Limiter) Learn(ctx context.Context, e Evidence) (Learned, error) {
	rule, err := l.ruleNamed(e.Rule)
	if err != nil {
		return Learned{}, err
	}
	if e.Key == "" {
		return Learned{}, fmt.Errorf("sluice: learn rule %q: empty key", e.Rule)
	}
	configured, name, err := l.learnedBase(rule, e.Key, e.Usage)
	if err != nil {
		return Learned{}, err
	}
	now := l.localNow(l.clock())
	id := learnedID{rule.Name, e.Key, e.Usage}
	t := &l.clients.learned
	t.lim.Store(l)
	b := t.budget(id, now, &l.clients.overrides.Others)
	if e.Usage {
		rule.usage.learned.Store(t)
	}
	tau := learn.Tau(shortestSpan(configured))

	b.mu.Lock()
	b.heard, b.tau = now, tau
	b.observe(now, &e, tau, shortestSpan(configured))
	prev := b.view.Load()
	var st learn.State
	var offset time.Duration
	if prev != nil {
		st, offset = prev.state, prev.offset
	}
	refuse := e.Refused && !e.Admitted.Before(b.guard.Add(tau))
	share := b.share()
	announced := len(b.quotas) > 0 && now.Before(b.quotaTill)
	sh, shared := l.cfg.store.(learnStore)
	read := shared && !refuse && !b.reading && now.Sub(b.read) >= learnRefresh
	if read {
		b.reading = true
	}
	b.publish(st, offset, tau)
	b.mu.Unlock()

	cut := false
	if refuse {
		storeNow := now.Add(offset)
		p := st.Cut(storeNow.UnixMilli(), tau, share, e.Admitted.Add(offset).UnixMilli(), announced)
		if shared {
			st, offset, cut, err = l.learnShared(ctx, sh, name, e.Key, now, &p, now.Sub(e.Admitted), tau)
			if err == nil && !cut && st.At != p.BaseAt && !e.Admitted.Add(offset).Before(time.UnixMilli(st.At+p.Guard)) {
				// Another process cut since this one last read, before
				// this request was admitted: the refusal is news to
				// that cut too.
				p = st.Cut(now.Add(offset).UnixMilli(), tau, share, e.Admitted.Add(offset).UnixMilli(), announced)
				st, offset, cut, err = l.learnShared(ctx, sh, name, e.Key, now, &p, now.Sub(e.Admitted), tau)
			}
		} else {
			b.mu.Lock()
			if v := b.view.Load(); v != nil {
				st = v.state
			}
			st, cut = learn.Commit(st, p, storeNow.UnixMilli())
			b.mu.Unlock()
		}
	} else if read {
		st, offset, _, err = l.learnShared(ctx, sh, name, e.Key, now, nil, 0, tau)
	}

	b.mu.Lock()
	if read {
		b.reading = false
	}
	if (read || refuse && shared) && err == nil {
		b.read = now
	}
	if v := b.view.Load(); v != nil && (err != nil || v.state.At > st.At) {
		// The fraction known stands: the store failed (and reports its
		// failures), or a later cut was published meanwhile by a
		// concurrent Learn (cuts only move At on).
		st, offset = v.state, v.offset
	}
	v := b.publish(st, offset, tau)
	out := l.learnedOf(id, b, v, rule, configured, now)
	out.Cut = cut
	changed := len(out.Limits) > 0 && out.Limits[0].Requests != b.reported
	if changed {
		b.reported = out.Limits[0].Requests
	}
	b.mu.Unlock()

	unit := out.Unit
	if cut {
		l.ReportOutbound(OutboundEvent{Kind: OutboundCut, Rule: rule.Name, Unit: unit, Units: out.Limits[0].Requests, Limit: out.Configured[0].Requests})
	}
	if changed {
		l.ReportOutbound(OutboundEvent{Kind: OutboundLearned, Rule: rule.Name, Unit: unit, Units: out.Limits[0].Requests, Limit: out.Configured[0].Requests})
	}
	if err != nil {
		return out, fmt.Errorf("%w: learn rule %q: %w", ErrStore, rule.Name, err)
	}
	return out, nil
}

// learnShared reads, or commits p to, the fleet's fraction of name for
// key, and returns it with the offset of the store's clock.
func (l *Limiter) learnShared(ctx context.Context, sh learnStore, name, key string, now time.Time, p *learn.Proposal, ago, tau time.Duration) (learn.State, time.Duration, bool, error) {
	st, at, applied, err := sh.learned(ctx, l.clock(), name, key, p, ago, learnLife*tau)
	if err != nil {
		return learn.State{}, 0, false, err
	}
	// The store's clock against this Limiter's, at the end of the call
	// (the call's own duration is in the offset: milliseconds, against
	// fractions that move over seconds).
	return st, time.UnixMilli(at).Sub(l.localNow(l.clock())), applied, nil
}

// observe records what e says of the upstream: its answer's duration, its
// quota and the window of its resets, whether it refused. b.mu is held.
func (b *learnedBudget) observe(now time.Time, e *Evidence, tau, span time.Duration) {
	if e.Answered > 0 {
		b.spread.Add(e.Answered)
	}
	b.margin = e.Margin
	if len(e.Quotas) > 0 {
		was := int64(0)
		if now.Before(b.quotaTill) {
			was = quotaBound(b.quotas, span)
		}
		if is := quotaBound(e.Quotas, span); was == 0 || is < was {
			// A quota newly announced, or lower than the last: the
			// refusals of requests admitted until a time unit from now
			// are its own (the upstream's window, and the previous
			// window of a sliding-window counter, hold what was sent
			// before it for that long).
			b.guard = now.Add(tau)
		}
		if !slices.Equal(b.quotas, e.Quotas) {
			b.quotas = slices.Clone(e.Quotas)
		}
		b.quotaTill = now.Add(quotaFor)
	}
	// The answers of the current and the previous time unit, of requests
	// admitted under the budget as it stands (see Learn's guard).
	if now.Sub(b.unit) >= tau {
		if now.Sub(b.unit) >= 2*tau {
			b.answers, b.refus = [2]int{}, [2]int{}
		} else {
			b.answers, b.refus = [2]int{b.answers[1], 0}, [2]int{b.refus[1], 0}
		}
		b.unit = now
	}
	if !e.Admitted.IsZero() && e.Admitted.Before(b.guard.Add(tau)) {
		return
	}
	b.answers[1]++
	if e.Refused {
		b.refus[1]++
	}
}

// share estimates the share of the requests admitted under the budget as
// it stands that the upstream refuses, from the answers of the last one
// or two time units: refused / (answers + 4), so that a refusal among
// few answers does not read as an upstream that refuses everything. b.mu
// is held.
func (b *learnedBudget) share() float64 {
	return float64(b.refus[0]+b.refus[1]) / float64(b.answers[0]+b.answers[1]+4)
}

// publish makes decisions see st and what b knows of the upstream, and
// returns the view. b.mu is held.
func (b *learnedBudget) publish(st learn.State, offset, tau time.Duration) *learnedView {
	v := &learnedView{state: st, offset: offset, tau: tau}
	if len(b.quotas) > 0 {
		v.quotas, v.quotaTill = b.quotas, b.quotaTill
		spread := b.spread.Value()
		for _, q := range b.quotas {
			m := learn.Margin(q.Units, q.Window, spread)
			if b.margin != 0 {
				m = max(int64(b.margin), 0)
			}
			v.margins = append(v.margins, m)
		}
	}
	b.view.Store(v)
	return v
}

// learnedBase returns the limits in force of the budget (the client's
// override, else the rule's; the usage's) and the name of its counters.
func (l *Limiter) learnedBase(rule *compiledRule, key string, usage bool) ([]Limit, string, error) {
	if usage {
		if rule.usage == nil {
			return nil, "", fmt.Errorf("%w: rule %q has no usage limits", ErrNotLearnable, rule.Name)
		}
		return rule.usage.Limits, rule.usage.name, nil
	}
	if cl := l.operatorOverride(rule, key); cl != nil {
		return cl.nominal, rule.Name, nil
	}
	if rule.LimitsFunc != nil || len(rule.nominal) == 0 {
		return nil, "", fmt.Errorf("%w: rule %q has no static limits", ErrNotLearnable, rule.Name)
	}
	return rule.nominal, rule.Name, nil
}

// quotaBound is what quotas admit per span, the least of them, without
// a margin.
func quotaBound(quotas []Quota, span time.Duration) int64 {
	var b int64
	for _, q := range quotas {
		if n := learn.Bound(q.Units, q.Window, span, 0); b == 0 || n < b {
			b = n
		}
	}
	return b
}

// rateSpan is the time over which a limit admits its Requests at its
// steady rate: its Window (the refill of a token or leaky bucket, not the
// time its burst takes), or a calendar period's nominal length.
func rateSpan(l Limit) time.Duration {
	if l.Window > 0 {
		return l.Window
	}
	return l.Span()
}

// shortestSpan is the shortest span of limits.
func shortestSpan(limits []Limit) time.Duration {
	var s time.Duration
	for _, l := range limits {
		if d := rateSpan(l); s == 0 || d < s {
			s = d
		}
	}
	return s
}

// burst is the least burst of the pacer: the largest margin v keeps.
func (v *learnedView) burst() int {
	b := 0
	for _, m := range v.margins {
		b = max(b, int(m))
	}
	return b
}

// lowered returns configured lowered to what v says at now, and whether
// any limit is below its configured one. floor is the least a limit may
// be lowered to (a usage's Max), 1 for rules.
func (v *learnedView) lowered(configured []Limit, now time.Time, floor int, ns []int) ([]int, bool) {
	f := v.state.Fraction(now.Add(v.offset).UnixMilli(), v.tau)
	quota := len(v.quotas) > 0 && now.Before(v.quotaTill)
	low := false
	ns = ns[:0]
	for _, c := range configured {
		ceiling := int64(c.Requests)
		if quota {
			for i, q := range v.quotas {
				ceiling = min(ceiling, learn.Bound(q.Units, q.Window, rateSpan(c), v.margins[i]))
			}
		}
		n := int(min(learn.Limit(ceiling, f), int64(c.Requests)))
		n = min(max(n, floor), c.Requests)
		if n < c.Requests {
			low = true
		}
		ns = append(ns, n)
	}
	return ns, low
}

// learnedLimits returns the limits of rule for key as learned, compiled,
// against base (the client's override, nil for the rule's), or nil when
// nothing was learned below them. It is read by decisions.
func (l *Limiter) learnedLimits(rule *compiledRule, key string, base *compiledLimits) *compiledLimits {
	b := l.clients.learned.get(learnedID{rule.Name, key, false})
	if b == nil {
		return nil
	}
	v := b.view.Load()
	if v == nil {
		return nil
	}
	configured := rule.nominal
	if base != nil {
		configured = base.nominal
	}
	if len(configured) == 0 {
		return nil
	}
	var arr [4]int
	ns, low := v.lowered(configured, l.localNow(l.clock()), 1, arr[:0])
	if !low {
		return nil
	}
	burst := v.burst()
	if c := b.compiled.Load(); c != nil && c.rule == rule && c.base == base && c.burst == burst && slices.Equal(c.ns, ns) {
		return c.cl
	}
	limits := make([]Limit, len(configured), len(configured)+1)
	for i, c := range configured {
		limits[i] = lowerTo(c, ns[i])
	}
	if p, ok := pacer(rule, limits, burst); ok {
		limits = append(limits, p)
	}
	cl := compileLimits(rule, limits)
	if cl.err != nil {
		l.cfg.report(nil, fmt.Errorf("sluice: learned limits of rule %q: %w", rule.Name, cl.err))
		return nil
	}
	b.compiled.Store(&learnedCompiled{rule: rule, base: base, ns: slices.Clone(ns), burst: burst, cl: cl})
	return cl
}

// pacer returns the limit that spends a learned budget evenly: a token
// bucket at the rate of the learned limit of the shortest window (k × its
// Requests per k × its window, k the least from 2 whose window no other
// limit has), whose burst is 2% of that limit, at least 2, the rule's
// Cost and least (the units the margin keeps for the spread of the
// answers, which the burst lets the fleet make up for when its requests
// come late). A window spent in a burst, after a pause or when the budget
// rises, is counted by a sliding-window counter as if spread over the
// window: an upstream that counts exactly would see more than the limit
// in the next one. Only a budget of a window of at most a second
// (paceWindow) is paced: a longer window's budget is one a program may
// want in a burst, which pacing would spread over the window. A rule with a
// CostFunc has none (its costs are not known in advance, and a burst
// below one of them would never admit it).
func pacer(rule *compiledRule, limits []Limit, least int) (Limit, bool) {
	if rule.CostFunc != nil || len(limits) == 0 {
		return Limit{}, false
	}
	short := 0
	for i, l := range limits {
		if rateSpan(l) < rateSpan(limits[short]) {
			short = i
		}
	}
	l := limits[short]
	w := rateSpan(l)
	if w <= 0 || w > paceWindow || l.Algorithm == LeakyBucket {
		return Limit{}, false // a leaky bucket spaces its requests already
	}
	burst := max(2, (l.Requests+49)/50, rule.Cost, least)
	for k := 2; k < 10; k++ {
		p := Limit{Requests: k * l.Requests, Window: time.Duration(k) * w}.TokenBucket(burst)
		if p.Validate() != nil {
			return Limit{}, false
		}
		name := windowName(p)
		if !slices.ContainsFunc(limits, func(o Limit) bool { return windowName(o) == name }) {
			return p, true
		}
	}
	return Limit{}, false
}

// learnedUsage returns the usage limits of u for key as learned, or nil
// when nothing was learned below them. It is read by decisions.
func (t *learnedTable) learnedUsage(u *compiledUsage, key string) []Limit {
	b := t.get(learnedID{u.rule, key, true})
	if b == nil {
		return nil
	}
	v := b.view.Load()
	if v == nil {
		return nil
	}
	now := time.Now()
	if l := t.lim.Load(); l != nil {
		now = l.localNow(l.clock())
	}
	var arr [4]int
	ns, low := v.lowered(u.Limits, now, u.max, arr[:0])
	if !low {
		return nil
	}
	if c := b.compiled.Load(); c != nil && slices.Equal(c.ns, ns) && len(c.limits) == len(u.Limits) {
		return c.limits
	}
	limits := make([]Limit, len(u.Limits))
	for i, c := range u.Limits {
		limits[i] = lowerTo(c, ns[i])
	}
	b.compiled.Store(&learnedCompiled{ns: slices.Clone(ns), limits: limits})
	return limits
}

// lowerTo is l with n requests, its burst no more.
func lowerTo(l Limit, n int) Limit {
	l.Requests = n
	if l.Burst > n {
		l.Burst = n
	}
	return l
}

// learnedOf describes budget b as v says at now. b.mu is held.
func (l *Limiter) learnedOf(id learnedID, b *learnedBudget, v *learnedView, rule *compiledRule, configured []Limit, now time.Time) Learned {
	out := Learned{Rule: id.rule, Key: id.key, Unit: "requests", Configured: slices.Clone(configured)}
	floor := 1
	if id.usage {
		out.Unit = rule.usage.Unit
		floor = rule.usage.max
	}
	ns, low := v.lowered(configured, now, floor, nil)
	out.Limits = make([]Limit, len(configured))
	for i, c := range configured {
		out.Limits[i] = lowerTo(c, ns[i])
	}
	if low && !id.usage {
		out.Pace, _ = pacer(rule, out.Limits, v.burst())
	}
	if len(v.quotas) > 0 && now.Before(v.quotaTill) {
		out.Quotas, out.Margins = slices.Clone(v.quotas), slices.Clone(v.margins)
	}
	out.Spread = b.spread.Value()
	out.Fraction = v.state.Fraction(now.Add(v.offset).UnixMilli(), v.tau)
	out.Cuts = v.state.Cuts
	if v.state.At != 0 {
		out.CutAt = time.UnixMilli(v.state.At).Add(-v.offset)
	}
	return out
}

// Learned returns what the Limiter learned of each budget it learns (see
// Learn), by rule, key and unit: the limits in force against those
// configured, the upstream's quota, the margin and the fleet's fraction.
// The operator page shows them beside the overrides.
func (l *Limiter) Learned() []Learned {
	now := l.localNow(l.clock())
	var out []Learned
	for _, e := range l.clients.learned.list() {
		rule, err := l.ruleNamed(e.id.rule)
		if err != nil {
			continue
		}
		configured, _, err := l.learnedBase(rule, e.id.key, e.id.usage)
		if err != nil {
			continue
		}
		e.b.mu.Lock()
		if v := e.b.view.Load(); v != nil {
			out = append(out, l.learnedOf(e.id, e.b, v, rule, configured, now))
		}
		e.b.mu.Unlock()
	}
	return out
}

// Forget drops what the Limiter learned of the budget of rule for key
// (its limits and its usage), here: the limits in force apply again at
// once. With a shared store, the fleet's fraction stays (other processes
// still read it), and this Limiter reads it again at the next Learn.
func (l *Limiter) Forget(rule, key string) bool {
	t := &l.clients.learned
	t.mu.Lock()
	defer t.mu.Unlock()
	was := false
	for _, usage := range []bool{false, true} {
		id := learnedID{rule, key, usage}
		if _, ok := t.m[id]; ok {
			delete(t.m, id)
			was = true
		}
	}
	t.n.Store(int64(len(t.m)))
	l.clients.overrides.Others.Store(int64(len(t.m)))
	return was
}
