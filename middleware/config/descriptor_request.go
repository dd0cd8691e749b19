package config

import (
	"context"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// DescriptorEntry is one key and value of a rate limit descriptor, such as
// ("remote_address", "203.0.113.7") or ("database", "users").
type DescriptorEntry struct {
	Key, Value string
}

// Descriptor is one descriptor of a call to a rate limit service: its
// entries, in order, and the cost of the call under it.
type Descriptor struct {
	// Entries are the descriptor's keys and values, outermost first.
	Entries []DescriptorEntry
	// Cost is what the call consumes under the descriptor's limit: the
	// hits_addend of Envoy's API. A cost below 1 counts as 1 when the
	// descriptor is decided with middleware.Limiter.Decide.
	Cost int
}

// DescriptorRequest is a keyfunc.Request made of the descriptors of one
// call to a rate limit service (Envoy's ShouldRateLimit), one of which
// is decided at a time. It carries no HTTP request: its Method, Path,
// Route, RemoteAddr, Header and Values are empty.
//
// The rules of a descriptor file parsed with Env.RateLimitService match
// a DescriptorRequest, and only one, as the Envoy ratelimit service
// matches its configuration: a rule applies when the decided descriptor
// has exactly as many entries as the rule's descriptor is deep and each
// entry, in order, has the key of its level and a value the level selects
// (an exact value first, then a prefix ending in *, then any value). A
// rule named in the replaces list of another does not apply when that
// other rule applies to any descriptor of the same call. Each rule counts
// per combination of the values of its levels that have no exact value,
// and costs the decided descriptor's Cost.
type DescriptorRequest struct {
	ctx     context.Context
	descs   []Descriptor
	i       int
	matched DescriptorMatch
}

// DescriptorMatch is the rule that applied to the descriptor of a
// DescriptorRequest, as Matched reports it.
type DescriptorMatch struct {
	// Rule is the rule's name: the rate_limit's name, or else
	// domain.key_value.key.
	Rule string
	// Limit is the descriptor's rate_limit: requests_per_unit (0 for a
	// descriptor that denies every request) per unit, counted in fixed
	// windows. It is zero for an unlimited or allowlisted descriptor.
	Limit middleware.Limit
	// Unlimited reports a rate_limit with unlimited: true.
	Unlimited bool
	// Shadow reports shadow_mode: true.
	Shadow bool
	// Usage reports usage: true: a descriptor whose hits are a usage
	// reported after the fact, as Envoy's rate limit filter sends it at the
	// end of a stream (apply_on_stream_done). A call with hits_addend 0
	// checks it (OVER_LIMIT only once the budget is spent); any other is
	// charged whatever the counter holds (middleware.Limiter.Charge),
	// which may leave a debt, and is answered OK.
	Usage bool
}

// Matched returns the rule of the file that applied to the descriptor
// when the request was decided (by middleware.Limiter.Decide, or by
// calling the Match of each rule), and false when none did.
func (r *DescriptorRequest) Matched() (DescriptorMatch, bool) {
	return r.matched, r.matched.Rule != ""
}

// NewDescriptorRequest returns the DescriptorRequest that decides
// descs[i] among the descriptors descs of one call, whose context is ctx.
// It keeps descs, which must not change while the request is in use.
func NewDescriptorRequest(ctx context.Context, descs []Descriptor, i int) *DescriptorRequest {
	return &DescriptorRequest{ctx: ctx, descs: descs, i: i}
}

// Descriptor returns the descriptor being decided.
func (r *DescriptorRequest) Descriptor() Descriptor { return r.descs[r.i] }

// Context returns the context of the call.
func (r *DescriptorRequest) Context() context.Context { return r.ctx }

// Method returns "".
func (r *DescriptorRequest) Method() string { return "" }

// Path returns "".
func (r *DescriptorRequest) Path() string { return "" }

// Route returns "".
func (r *DescriptorRequest) Route() string { return "" }

// RemoteAddr returns "".
func (r *DescriptorRequest) RemoteAddr() string { return "" }

// Header returns "".
func (r *DescriptorRequest) Header(string) string { return "" }

// Values returns nil.
func (r *DescriptorRequest) Values(string) []string { return nil }

// matches reports whether the decided descriptor is selected by steps,
// level by level.
func (r *DescriptorRequest) matches(steps []*descStep) bool {
	entries := r.descs[r.i].Entries
	if len(entries) != len(steps) {
		return false
	}
	for i, s := range steps {
		if entries[i].Key != s.key || !s.matchesValue(entries[i].Value) {
			return false
		}
	}
	return true
}

// serviceRule makes r, the rule of the descriptor whose levels are steps,
// a rule of a rate limit service: it matches DescriptorRequests only (and
// records m in the one it matches), counts per value of its levels
// without an exact value and costs the descriptor's Cost.
func serviceRule(r *middleware.Rule, steps []*descStep, m DescriptorMatch) {
	r.Match = func(req keyfunc.Request) bool {
		dr, ok := req.(*DescriptorRequest)
		if !ok || !dr.matches(steps) {
			return false
		}
		dr.matched = m
		return true
	}
	var keys []keyfunc.Func
	for i, s := range steps {
		if s.kind == stepExact {
			continue
		}
		prefix := "d:" + keyfunc.Escape(s.key) + ":"
		keys = append(keys, func(req keyfunc.Request) (string, error) {
			dr, ok := req.(*DescriptorRequest)
			if !ok || len(dr.descs[dr.i].Entries) <= i {
				return "", keyfunc.ErrNoKey
			}
			return prefix + keyfunc.Hash(dr.descs[dr.i].Entries[i].Value), nil
		})
	}
	switch len(keys) {
	case 0:
		r.Key = keyfunc.Global()
	case 1:
		r.Key = keys[0]
	default:
		r.Key = keyfunc.Join(keys...)
	}
	r.CostFunc = func(req keyfunc.Request) int {
		if dr, ok := req.(*DescriptorRequest); ok {
			return dr.descs[dr.i].Cost
		}
		return 1
	}
}

// replacedInService returns the Match of a rule of a rate limit service
// whose own Match is own and that gives way to the rules whose Matches
// are replacers: it does not apply to a descriptor of a call when a
// replacer applies to any descriptor of that call.
func replacedInService(own func(keyfunc.Request) bool, replacers []func(keyfunc.Request) bool) func(keyfunc.Request) bool {
	return func(req keyfunc.Request) bool {
		if !own(req) {
			return false
		}
		dr := req.(*DescriptorRequest) // own matched, so it is one
		other := *dr
		for j := range dr.descs {
			other.i = j
			for _, m := range replacers {
				if m(&other) {
					dr.matched = DescriptorMatch{}
					return false
				}
			}
		}
		return true
	}
}

// HeaderStyleSet reports whether the file sets headers; HeaderStyle is
// headers.Both when it does not.
func (c *Document) HeaderStyleSet() bool { return c.headersLine > 0 }
