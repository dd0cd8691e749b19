package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	b := t.budget(id, now, l.clients.overrides.SetOthers)
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
	l.clients.overrides.SetOthers(len(t.m))
	return was
}
