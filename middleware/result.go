package middleware

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/hitters"
)

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
	others   string      // the RateLimit items of the other policies of a request with usage limits
	status   int         // the status of a concurrency denial, 0 for 429
	hold     *hold       // concurrency slots to give back (Done)
	settle   *settlement // what to settle when the request ends (Finish): charges to give back if its response does not count, its usage
	key      string      // the binding limit's key, for hashed logs
	blocked  bool        // denied by a Deny rule
	// prepared is the binding limit's fixed header text, if it has one.
	prepared *headerwrite.Prepared
	// top is the sampling gates of the binding limit's rule, for the
	// top-client tracker (nil if untracked).
	top *hitters.Gates
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
		if u := metas[i].usage; u != nil {
			res.Rule = u.rule
		}
		res.prepared, res.top = metas[i].prepared, metas[i].top
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
	if len(ds) > 1 && anyUsageMeta(metas) {
		// A request limited in several units reports each policy.
		res.others = others(best, charges, ds, metas)
	}
}

// anyUsageMeta reports whether a charge is of a usage limit.
func anyUsageMeta(metas []chargeMeta) bool {
	for i := range metas {
		if metas[i].usage != nil {
			return true
		}
	}
	return false
}

// others returns the RateLimit items of every limit but the binding one,
// best: a request limited in several units (Rule.Usage) reports each of
// its policies in the RateLimit field, the binding one first.
func others(best int, charges []Charge, ds []Decision, metas []chargeMeta) string {
	var b []byte
	for i := range ds {
		if i == best {
			continue
		}
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = headerwrite.AppendQuoted(b, metas[i].name)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, int64(nominalRemaining(ds[i].Remaining, &charges[i].Limit, metas[i].nominal)), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, headerwrite.Seconds(ds[i].NextAfter), 10)
	}
	return string(b)
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

// Finish ends a request: it gives back the request's concurrency slots
// (as Done does); for rules that count by outcome (Rule.Count), it gives
// back the request's charges if the response's status does not count; and
// for usage limits (Rule.Usage), it charges the difference between what
// the request used (Settle) and what it was charged when admitted, or
// gives it back.
// Front ends call it once the handler has returned, with the status the
// client got, or 0 if the handler panicked (counted as 500); Handler and
// the Gin, Echo and Fiber adapters do. It is safe to call on any Result,
// more than once, and from any goroutine: only the first call settles.
func (res *Result) Finish(status int) {
	if s := res.settle; s != nil {
		if status == 0 {
			status = panicStatus
		}
		s.once.Do(func() { s.finish(status) })
	}
	res.Done()
}
