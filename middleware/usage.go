package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/usage"
	"github.com/sluicehq/sluice/keyfunc"
)

// Usage limits what a rule's requests use, in a unit known in full only
// once a request has run: an LLM's tokens, a query's cost, bytes sent,
// seconds of work. It sits beside the rule's Limits, which count requests
// (or Cost units) as usual: a rule may limit requests per minute and
// tokens per minute at once, and a request passes only if both admit it.
//
// A request is charged Estimate (or EstimateFunc's) on the usage limits
// when it is admitted, in the same store call as the rule's other limits,
// and reports what it used once it has: from the handler with Settle (or
// Result.Settle), or in the response header Header. When the request ends
// (Result.Finish, which Handler and every adapter call), the difference
// is charged, or given back if the request used less than its estimate.
// The charge cannot be refused, since the work is done: it may take a
// counter past its limit, a debt that the client waits off (Remaining is
// 0, and Retry-After and the t of the RateLimit field say when a request
// of the estimated cost fits again; see Decision.Debt). A request that
// reports nothing keeps its estimate.
//
// A usage limit denies a request only when the client's budget is already
// spent, not when the estimate does not fit what is left: the request is
// then admitted on one unit, and the rest of its usage is charged when it
// ends. Within one window of a usage limit, a client therefore gets at
// most
//
//	limit + (its requests in flight) × Max
//
// units: each request admitted before its usage was known found the count
// below the limit and was charged at most Max in all. In write-back mode
// (Rule.Sync) each app server's units not yet pushed add app servers ×
// (MaxUnsynced + Max); lease mode and regions keep the bound of their
// mode on top (docs/fleet.md, docs/regions.md).
//
// The usage limits are sliding windows, fixed windows (and calendar
// periods), token buckets or sliding logs, and need a store that can
// settle (a Settler: the memory and Redis stores, and RegionStore).
type Usage struct {
	// Unit names what the limits count, such as "tokens" or "bytes": the
	// usage limits' policies in the rate-limit headers are the rule's name
	// and the unit ("chat-tokens"; "chat-tokens-1m" and "chat-tokens-1d"
	// for several limits), and their counters are kept apart from the
	// rule's Limits. It must match [a-z0-9_]{1,32}.
	Unit string
	// Limits limit the units used per key, such as PerMinute(10000) for
	// 10,000 tokens a minute; one limit per window. Required.
	Limits []Limit
	// Estimate is what a request is charged when it is admitted, before
	// it runs, in units: 0 means 1. It is clamped to Max.
	Estimate int
	// EstimateFunc, when set, computes the estimate from the request (for
	// example the tokens of an LLM prompt) and replaces Estimate. A value
	// below 1 counts as 1, one above Max as Max.
	EstimateFunc func(r keyfunc.Request) int
	// Max is the most one request may be charged in all, its estimate and
	// its settle together: a settle above it is refused with ErrBadUsage
	// and changes nothing. It is the factor of the bound above. 0 means
	// the smallest capacity among Limits.
	Max int
	// Header, when set, names a response header in which the handler, or
	// the upstream behind a reverse proxy, reports the units the request
	// used: the front end settles the request with its value and removes
	// it before the response is sent. A usage known only once a streamed
	// body is written may come as a trailer of that name (declared in the
	// Trailer header, or set with http.TrailerPrefix), which is read and
	// removed when the handler returns. A value that is not a whole
	// number of units is reported to the Observers (StoreFailed, wrapping
	// ErrBadUsage) and the estimate stands.
	Header string
}

// SettleEvent reports that a request's usage was settled on one of its
// usage limits (Observer.Settled).
type SettleEvent struct {
	// Rule is the name of the rule, and Policy that of the usage limit
	// ("chat-tokens").
	Rule, Policy string
	// Units is what the request used in all, as it reported it; its
	// estimate if it reported nothing.
	Units int
	// Charged is what the settle charged: the difference between Units
	// and what the request was charged when admitted, negative when the
	// difference was given back.
	Charged int
	// Debt is how many units the limit's counter is past its limit after
	// the charge (see Decision.Debt): 0 when it is within it.
	Debt int
	// Err is the store's error, which wraps ErrStore, when the charge or
	// the refund failed: a charge that failed is not counted, a refund
	// that failed leaves the estimate counted.
	Err error
	// Context is the context of the request that settled (of the call of
	// Limiter.Charge), so that an Observer can record the settle on the
	// request's trace span; nil when unknown.
	Context context.Context
}

// The errors of settling a request's usage.
var (
	// ErrNoUsage: the request has no usage to settle. It was denied, not
	// decided (or decided without its limits, its store having failed
	// open), or no rule with Usage applied to it.
	ErrNoUsage = errors.New("sluice: settle: the request has no usage limit to settle")
	// ErrSettledTwice: the request already settled its usage; a request
	// settles once, with what it used in all.
	ErrSettledTwice = usage.ErrTwice
	// ErrBadUsage: the usage is negative, above the rule's Usage.Max, or
	// (from a response header) not a whole number of units.
	ErrBadUsage = usage.ErrBad
)

// Settle reports that the request used units in all, its estimate
// included, under the usage limits of the rules that applied to it (see
// Usage). The difference with what it was charged is settled when the
// request ends (Finish), or at once if it has already ended (a body
// streamed after the handler returned). It returns ErrNoUsage if the
// request has no usage limit to settle, ErrSettledTwice if it already
// settled, and ErrBadUsage if units is negative or above a rule's
// Usage.Max; it then changes nothing. Safe for concurrent use.
func (res *Result) Settle(units int) error {
	s := res.settle
	if s == nil || s.ledger == nil {
		return ErrNoUsage
	}
	return s.settleUnits(int64(units))
}

// Settle is Result.Settle for the request whose context is ctx: the
// context Handler gives the handler, or one from ContextWithResult. It
// returns ErrNoUsage for a context of no request with usage to settle.
func Settle(ctx context.Context, units int) error {
	s, _ := ctx.Value(settleKey).(*settlement)
	if s == nil || s.ledger == nil {
		return ErrNoUsage
	}
	return s.settleUnits(int64(units))
}

// settleKey is a pointer so that it fits in an interface without
// allocating.
var settleKey = &contextKey{"settle"}

// ContextWithResult returns a copy of ctx through which Settle reaches the
// usage of res, or ctx itself when res has no usage to settle. Handler
// gives it to the handler; the adapters give it to theirs (the request's
// context in Gin and Echo, the user context in Fiber, the call's in gRPC).
func ContextWithResult(ctx context.Context, res *Result) context.Context {
	if s := res.settle; s != nil && s.ledger != nil {
		return context.WithValue(ctx, settleKey, s)
	}
	return ctx
}

// ResponseHeader reads and removes the fields of a response not yet sent:
// http.Header has both methods, and the adapters wrap their frameworks'
// responses in it.
type ResponseHeader interface {
	Get(key string) string
	Del(key string)
}

// SettleFrom settles the request with the usage its handler reported in
// the response header of its rule (Usage.Header), and removes that field
// (and a trailer of the name, with http.TrailerPrefix) from h. Front ends
// call it before the response's header is sent, and again when the
// handler has returned, for a trailer. It does nothing, and returns nil,
// when the request has no such header to read or the field is absent; a
// value that is not a number is removed all the same, changes nothing and
// returns (and reports to the Observers) an error wrapping ErrBadUsage.
func (res *Result) SettleFrom(h ResponseHeader) error {
	if s := res.settle; s != nil {
		return s.settleFrom(h)
	}
	return nil
}

// Charge charges the cost of r to the limits of every rule that applies
// to it, whatever their counters hold, and decides nothing: a charge that
// cannot be refused, for a usage reported apart from the request that
// used it, as Envoy's rate limit filter reports a stream's usage when it
// ends (apply_on_stream_done) in a call of its own. The cost is the
// rule's Cost (or CostFunc's), charged on its Limits, and on its usage
// limits the estimate (Usage.Estimate or EstimateFunc, up to Usage.Max).
// A counter it takes past its limit is in debt, which the client waits
// off as after any settle (see Usage).
//
// The Result describes the binding limit after the charge (the fewest
// requests remaining), with Allowed set; the Observers are told of each
// limit charged (Settled) but not of a decision. Shadow rules, Deny rules,
// concurrency limits and adaptive concurrency are not charged. Charge
// needs a store that can settle (a Settler); it returns an error wrapping
// keyfunc.ErrNoKey when a rule finds no key, and one wrapping ErrStore
// when the store fails, and then nothing is counted (whatever the failure
// policy: a charge has no request to let through).
func (l *Limiter) Charge(r keyfunc.Request) (Result, error) {
	var res Result
	st, ok := l.cfg.store.(Settler)
	if !ok {
		return res, fmt.Errorf("sluice: Charge: %T cannot settle costs after the fact", l.cfg.store)
	}
	set := l.rules.Load()
	s := scratchPool.Get().(*scratch)
	defer s.release()
	matched, err := l.matchRules(set, r, s, &res)
	if err != nil {
		return res, err
	}
	if len(s.charges) == 0 {
		l.unlimited(matched, s, &res)
		res.Allowed = true
		return res, nil
	}
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	s.decisions = grow(s.decisions, len(s.charges))
	if err := st.Settle(r.Context(), now, s.charges, s.decisions); err != nil {
		err = fmt.Errorf("%w: %w", ErrStore, err)
		l.cfg.report(r, err)
		return Result{Rule: s.charges[0].Name}, err
	}
	s.result(&res, true, s.charges, s.decisions, s.metas)
	res.Outcome = OutcomeAllowed
	if o := l.cfg.obs; o != nil {
		for i := range s.charges {
			rule := s.charges[i].Name
			if u := s.metas[i].usage; u != nil {
				rule = u.rule
			}
			o.Settled(SettleEvent{Rule: rule, Policy: s.metas[i].name, Units: s.charges[i].Cost, Charged: s.charges[i].Cost, Debt: s.decisions[i].Debt, Context: r.Context()})
		}
	}
	if t := l.top.t; t != nil {
		l.noteTop(t, s, &res) // units charged, for the top clients
	}
	return res, nil
}
