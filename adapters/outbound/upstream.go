package outbound

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/learn"
	"github.com/sluicehq/sluice/internal/ratefields"
	"github.com/sluicehq/sluice/middleware"
)

// heard adapts the Limiter to what the upstream answered req, which the
// Limiter admitted with res at admitted (package internal/ratefields
// reads the fields, as untrusted input):
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
//   - the Limiter learns what the answer says of the budget of res's rule
//     and key (learn): the quotas announced, how long the answer took,
//     whether it was refused;
//   - when the upstream says fewer requests are left than the Limiter's
//     budget held, by a clear share, and announces no quota, the budget
//     follows it until its reset (followRemaining).
func (t *Transport) heard(req *http.Request, res *middleware.Result, resp *http.Response, admitted time.Time) {
	now := time.Now()
	f := ratefields.Parse(resp.Header, now)
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
	// The pause, the learning and the override outlive the caller's
	// interest in the response; their store calls are bounded by the
	// store's timeout.
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
	quotas := t.learn(ctx, res, &f, refused, admitted, now)
	if b := f.Requests; pause == 0 && len(quotas) == 0 && b.Known() && b.Remaining > 0 && b.Reset > 0 &&
		int64(res.Remaining)-b.Remaining >= int64(aheadShare(res.Limit.Capacity())) {
		t.followRemaining(ctx, res, int(b.Remaining), min(b.Reset, t.maxPause))
	}
}

// learn tells the Limiter what the answer f says of the budgets of res's
// rule and key (middleware.Limiter.Learn): of its requests, the quotas
// the upstream announced (RateLimit-Policy; X-RateLimit-Limit or
// x-ratelimit-limit-requests, with the window their resets show) and a
// refusal unless the upstream said only its tokens were spent; of its
// usage limits, x-ratelimit-limit-tokens and a refusal when no tokens
// were left. It returns the quotas of requests.
func (t *Transport) learn(ctx context.Context, res *middleware.Result, f *ratefields.Fields, refused bool, admitted, now time.Time) []middleware.Quota {
	if t.noLearn || res.Key() == "" {
		return nil
	}
	id := queueID{res.Rule, res.Key()}
	var quotas []middleware.Quota
	if len(f.Policies) > 0 {
		for _, p := range f.Policies {
			quotas = append(quotas, middleware.Quota{Units: p.Quota, Window: p.Window})
		}
	} else if b := f.Requests; b.Known() && b.Limit > 0 {
		quotas = []middleware.Quota{{Units: b.Limit, Window: t.windows.of(id, false, now, b.Reset)}}
	}
	tokensOut := f.Tokens.Known() && f.Tokens.Remaining == 0
	requestsOut := f.Requests.Known() && f.Requests.Remaining == 0
	e := middleware.Evidence{Rule: res.Rule, Key: res.Key(), Quotas: quotas, Margin: t.margin,
		Answered: now.Sub(admitted), Refused: refused && (requestsOut || !tokensOut), Admitted: admitted}
	// Every answer of a budget the Limiter learns counts (the share it
	// refuses, the spread of the answers, reading the fleet's fraction);
	// a budget is learned from its first answer with a field or a
	// refusal.
	if len(quotas) > 0 || refused || f.Requests.Known() || t.windows.learning(id) {
		if _, err := t.lim.Learn(ctx, e); err == nil || errors.Is(err, middleware.ErrStore) {
			t.windows.learn(id)
		}
	}
	if b := f.Tokens; b.Known() {
		e.Usage, e.Quotas, e.Refused = true, nil, refused && tokensOut
		if b.Limit > 0 {
			e.Quotas = []middleware.Quota{{Units: b.Limit, Window: t.windows.of(id, true, now, b.Reset)}}
		}
		_, _ = t.lim.Learn(ctx, e) // ErrNotLearnable for a rule without usage limits
	}
	return quotas
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
// An upstream that announces its quota (RateLimit-Policy,
// X-RateLimit-Limit, x-ratelimit-limit-requests) is followed by what the
// Limiter learns of it instead (learn), and its count is not: the budget
// would follow the count until the reset, and spring back to the rule's
// own limit then, which a fleet with requests waiting spends at once.
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

// maxWindows bounds the budgets whose windows a Transport infers; past
// it, it forgets them all and infers them again.
const maxWindows = 10_000

// windows infers, per rule, key and unit, the window of a quota an
// upstream announces without one (X-RateLimit-Limit,
// x-ratelimit-limit-*), from the resets it reports (learn.Windows).
type windows struct {
	mu sync.Mutex
	m  map[windowID]*learn.Windows
	// learned are the budgets of requests the Limiter learns; bounded
	// as m.
	learned map[queueID]bool
}

// learning reports whether the budget id is learned already, and notes
// that it is.
func (w *windows) learning(id queueID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.learned[id]
}

// learn notes that the budget id is learned.
func (w *windows) learn(id queueID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.learned == nil || len(w.learned) >= maxWindows {
		w.learned = map[queueID]bool{}
	}
	w.learned[id] = true
}

type windowID struct {
	queueID
	tokens bool
}

// of records a reset of d of the budget id at now and returns the window
// inferred: 0 when none is known yet.
func (w *windows) of(id queueID, tokens bool, now time.Time, d time.Duration) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := windowID{id, tokens}
	e := w.m[k]
	if e == nil {
		if w.m == nil || len(w.m) >= maxWindows {
			w.m = map[windowID]*learn.Windows{}
		}
		e = &learn.Windows{}
		w.m[k] = e
	}
	e.Observe(now, d)
	return e.Window()
}
