package middleware

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/learn"
)

// The table of the budgets a Limiter learns (learned.go), and what
// decisions read of it: each budget's view (its fraction, the quotas and
// margins), lowered to limits, compiled, and the pacer beside them.

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

// budget returns the budget id, made if new (dropping the budgets not
// heard of lately when the table is full); others is told the table's
// size after.
func (t *learnedTable) budget(id learnedID, now time.Time, others func(n int)) *learnedBudget {
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
	others(len(t.m))
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
			return cmp.Compare(a.id.rule, b.id.rule)
		case a.id.key != b.id.key:
			return cmp.Compare(a.id.key, b.id.key)
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
	// A budget at an upstream's announced limit is decided in the store,
	// in any Sync mode: a lease's slice spent up to an interval after it
	// was counted, or a write-back's unsynced count, puts an upstream
	// that counts exactly over its limit now and then, and each refusal
	// may pause the fleet a second. It costs each request a round trip
	// to Redis, small beside the upstream's own.
	cl.exact = true
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
