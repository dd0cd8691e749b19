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
//   - a 429, or a 503 with Retry-After, is reported (OutboundRefused);
//   - with a Retry-After of more than zero, the request's keys are paused
//     for that long (capped at MaxPause), for the whole fleet: one write
//     per key;
//   - otherwise, when the upstream says a budget of requests or tokens
//     has nothing left until a reset while the Limiter's budget still had
//     some (or the upstream refused the request), the keys are paused
//     until the reset;
//   - a quota the upstream announces (RateLimit-Policy) below the rule's
//     lowers the rule's limits for the key (followPolicies).
func (t *Transport) heard(req *http.Request, res *middleware.Result, resp *http.Response) {
	f := ratefields.Parse(resp.Header, time.Now())
	status := resp.StatusCode
	refused := status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable && f.HasRetryAfter
	if refused {
		t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundRefused, Rule: res.Rule, Status: status})
	}
	var pause time.Duration
	switch {
	case refused && f.RetryAfter > 0:
		pause = f.RetryAfter
	case res.Remaining > 0 || status == http.StatusTooManyRequests:
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
	if len(f.Policies) > 0 {
		t.followPolicies(ctx, res, resp.Header.Get(ratefields.RateLimitPolicy), f.Policies)
	}
}

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
// and by how many units per window they were lowered in all. A quota of q
// per window w binds a limit of n per window W at q × W / w when w ≤ W
// (the upstream's windows fit in ours), and at q when w > W (a window of
// ours fits in the upstream's); policies without a window bind nothing.
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
			bound = min(bound, max(math.Floor(q), 1))
		}
		if n := int(bound); n < l.Requests {
			units += l.Requests - n
			out[i].Requests = n
			out[i].Burst = min(out[i].Burst, n)
		}
	}
	return out, units
}
