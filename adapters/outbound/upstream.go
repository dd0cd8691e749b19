package outbound

import (
	"context"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/ratefields"
	"github.com/sluicehq/sluice/middleware"
)

// heard adapts the Limiter to what the upstream answered req, which the
// Limiter admitted with res (package internal/ratefields reads the
// fields, as untrusted input):
//
//   - a refusal is reported (OutboundRefused): a 429, or a 403 or 503 that
//     says why (a Retry-After, or no requests left, as GitHub answers);
//   - with a Retry-After of more than zero, the request's keys are paused
//     for that long (capped at MaxPause), for the whole fleet: one write
//     per key;
//   - otherwise, when the upstream says a budget of requests or tokens
//     has nothing left until a reset while the Limiter's budget still
//     had a clear share of its own (aheadShare) or the upstream refused
//     the request, the keys are paused until the reset;
//   - when it says fewer requests are left than the Limiter's budget held,
//     by a clear share, and announces no quota, the budget follows it
//     until its reset (followRemaining);
//   - a quota the upstream announces (RateLimit-Policy) below the rule's
//     lowers the rule's limits for the key (followPolicies).
func (t *Transport) heard(req *http.Request, res *middleware.Result, resp *http.Response) {
	f := ratefields.Parse(resp.Header, time.Now())
	status := resp.StatusCode
	refused := status == http.StatusTooManyRequests ||
		(status == http.StatusForbidden || status == http.StatusServiceUnavailable) &&
			(f.HasRetryAfter || f.Requests.Known() && f.Requests.Remaining == 0)
	if refused {
		t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundRefused, Rule: res.Rule, Status: status})
	}
	var pause time.Duration
	switch {
	case refused && f.RetryAfter > 0:
		pause = f.RetryAfter
	case refused || res.Remaining >= aheadShare(res.Limit.Capacity()):
		for _, b := range [...]ratefields.Budget{f.Requests, f.Tokens} {
			if b.Known() && b.Remaining == 0 {
				pause = max(pause, b.Reset)
			}
		}
	}
	// The pause and override outlive the caller's interest in the
	// response; their store calls are bounded by the store's timeout.
	ctx := context.WithoutCancel(req.Context())
	if pause > 0 {
		pause = min(pause, t.maxPause)
		// A failed write to the store still pauses this process
		// (Limiter.Pause); the store reports its failures to the
		// observers.
		if until, _ := t.lim.Pause(ctx, &Request{req: req, ctx: ctx}, pause); !until.IsZero() {
			t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundPaused, Rule: res.Rule, Duration: pause})
		}
	}
	if b := f.Requests; pause == 0 && len(f.Policies) == 0 && b.Known() && b.Remaining > 0 && b.Reset > 0 &&
		int64(res.Remaining)-b.Remaining >= int64(aheadShare(res.Limit.Capacity())) {
		t.followRemaining(ctx, res, int(b.Remaining), min(b.Reset, t.maxPause))
	}
	if len(f.Policies) > 0 {
		t.followPolicies(ctx, res, resp.Header.Get(ratefields.RateLimitPolicy), f.Policies)
	}
}

// followRemaining lowers, until the upstream's reset, the limit of the
// binding rule of res for its key by what the upstream says is left less
// than the Limiter's budget holds: an override (Limiter.SetOverride; with
// Redis, for the whole fleet) whose limit is the rule's less the
// difference, so that the budget has no more left than the upstream for
// as long as the upstream's count lasts.
//
// The difference is taken against the budget as it stands now
// (Limiter.Peek), not as it stood when res was admitted: the requests
// admitted since, some of which reached the upstream before res did, are
// counted in the budget now, and those still on their way are not yet
// counted upstream, so a difference found now is one the upstream really
// has (another client of the same account, a stricter limit). res's own
// Remaining only tells whether to look. It applies to a rule with one
// limit of requests, binding res (not a usage limit); others rely on the
// pause at none left.
//
// An upstream that announces its quota (RateLimit-Policy) is followed by
// that instead (followPolicies), and its count is not: the two would
// replace each other's override, and between the end of the one that
// followed the count and the next answer the budget would be the rule's
// own, which a fleet with requests waiting spends at once.
func (t *Transport) followRemaining(ctx context.Context, res *middleware.Result, left int, reset time.Duration) {
	if res.Policy != res.Rule || res.Key() == "" {
		return // a rule with several limits, or a usage limit, binds
	}
	limits := t.limitsOf(res.Rule, res.Key())
	if len(limits) != 1 {
		return
	}
	st, err := t.lim.Peek(ctx, res.Rule, res.Key())
	if err != nil || len(st) != 1 {
		return
	}
	cut := st[0].Remaining - left
	if cut < aheadShare(limits[0].Capacity()) {
		return
	}
	l := limits[0]
	l.Requests = max(l.Requests-cut, 1)
	l.Burst = min(l.Burst, l.Requests)
	o := middleware.Override{Rule: res.Rule, Key: res.Key(), Limits: []middleware.Limit{l}, Until: time.Now().Add(reset)}
	if err := t.lim.SetOverride(ctx, o); err == nil {
		t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundLowered, Rule: res.Rule, Units: cut})
	}
}

// aheadShare is by how many units the Limiter's budget must hold more
// than the upstream says is left for the transport to act before the
// upstream refuses anything (a pause at none left, a budget lowered to the
// upstream's count): 10% of the limit, at least 4. A budget spent to its
// last units on both sides is the normal state of a fleet that uses all
// of an upstream's quota, and the two counts differ by a few units while
// requests are in flight, when the two windows are out of step, or (in
// lease mode) by the slices other processes hold; acting then (a pause
// lasts whole seconds, as Retry-After and resets come) would cost far
// more than the refusal it might spare, which pauses the keys anyway.
func aheadShare(capacity int) int { return max(4, capacity/10) }

// followFor is how long a limit lowered to an upstream's announced quota
// holds without being announced again; announced again, it is renewed
// once half of it has passed.
const followFor = time.Minute

// maxFollowed bounds the keys a follower remembers; past it, it forgets
// them all and learns them again.
const maxFollowed = 10_000

// follower remembers, per rule and key, the RateLimit-Policy last acted
// on, so that a quota announced on every response is acted on once per
// half followFor.
type follower struct {
	mu   sync.Mutex
	seen map[queueID]followed
}

type followed struct {
	policy  string
	refresh time.Time
}

// due reports whether the policy announced for id should be acted on now,
// and if so notes that it is.
func (f *follower) due(id queueID, policy string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.seen[id]; ok && st.policy == policy && now.Before(st.refresh) {
		return false
	}
	if f.seen == nil || len(f.seen) >= maxFollowed {
		f.seen = map[queueID]followed{}
	}
	f.seen[id] = followed{policy, now.Add(followFor / 2)}
	return true
}

// followPolicies lowers the limits of the binding rule of res, for its
// key, to the quotas the upstream announced where they are lower, for
// followFor: a Limiter override (Limiter.SetOverride), so with a shared
// store the whole fleet follows. The limits lowered are the override's in
// force, else the rule's.
func (t *Transport) followPolicies(ctx context.Context, res *middleware.Result, raw string, ps []ratefields.Policy) {
	id := queueID{res.Rule, res.Key()}
	now := time.Now()
	if id.key == "" || !t.follow.due(id, raw, now) {
		return
	}
	limits := t.limitsOf(res.Rule, id.key)
	lowered, units := lower(limits, ps)
	if units == 0 {
		return
	}
	o := middleware.Override{Rule: id.rule, Key: id.key, Limits: lowered, Until: now.Add(followFor)}
	if err := t.lim.SetOverride(ctx, o); err == nil {
		t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundLowered, Rule: res.Rule, Units: units})
	}
}

// limitsOf returns the limits in force for key under rule: its override's,
// else the rule's static limits (none for a rule with a LimitsFunc).
func (t *Transport) limitsOf(rule, key string) []middleware.Limit {
	if o, ok := t.lim.Override(rule, key); ok {
		return o.Limits
	}
	for _, r := range t.lim.Rules() {
		if r.Name == rule {
			return r.Limits
		}
	}
	return nil
}

// lower returns limits with each lowered to the quotas of ps that bind it,
// less a margin, and by how many units per window they were lowered in
// all. A quota of q per window w binds a limit of n per window W at
// q' = q × W / w when w ≤ W (the upstream's windows fit in ours), and at
// q' = q when w > W (a window of ours fits in the upstream's); policies
// without a window bind nothing. The limit becomes q' less 1% of it (at
// least 1 unit, and never below 1): the upstream counts requests when
// they arrive and the Limiter when it admits them, so the two windows
// are out of step by the network's delay, and a budget spent to its last
// unit at the edge of one is refused at the edge of the other (a margin
// of one unit in a hundred absorbs some milliseconds of delay and jitter
// at a hundred a second; BENCHMARKS.md, "Outbound").
func lower(limits []middleware.Limit, ps []ratefields.Policy) ([]middleware.Limit, int) {
	out := make([]middleware.Limit, len(limits))
	units := 0
	for i, l := range limits {
		out[i] = l
		span := l.Window
		if span <= 0 {
			span = l.Span() // a calendar period
		}
		bound := float64(l.Requests)
		for _, p := range ps {
			if p.Window <= 0 {
				continue
			}
			q := float64(p.Quota)
			if p.Window < span {
				q = q * float64(span) / float64(p.Window)
			}
			q = math.Floor(q)
			bound = min(bound, max(q-max(math.Ceil(q/100), 1), 1))
		}
		if n := int(bound); n < l.Requests {
			units += l.Requests - n
			out[i].Requests = n
			out[i].Burst = min(out[i].Burst, n)
		}
	}
	return out, units
}
