package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// DefaultTimeout bounds each ShouldRateLimit call when Options.Timeout is
// 0: well inside the 20 ms Envoy's rate_limit filter waits by default, so
// that a slow store is answered by the failure policy before Envoy gives
// up on the call.
const DefaultTimeout = 10 * time.Millisecond

// maxCost bounds the hits of one descriptor: far above any limit, and
// within an int everywhere.
const maxCost = 1 << 50

// Domain is one domain the Server answers for: its Limiter and the
// descriptor file in force, whose Domain field names it. A
// *config.Reloader is a Domain, and keeps the file up to date.
type Domain interface {
	Limiter() *middleware.Limiter
	Document() *config.Document
}

// Options configure a Server. The zero value is usable.
type Options struct {
	// Timeout bounds each call, from the moment it arrives until every
	// descriptor is decided; 0 means DefaultTimeout. A call whose store
	// does not answer in time is answered by the failure policy of the
	// domain's Limiter. A deadline of the call's own that is earlier wins.
	Timeout time.Duration
}

// Server answers envoy.service.ratelimit.v3.RateLimitService's
// ShouldRateLimit from Limiters built from Envoy/Lyft descriptor files
// parsed with config.Env.RateLimitService. Register it on a grpc.Server
// with Register. It is safe for concurrent use.
//
// Each descriptor of a call is decided by its own Limiter.Decide (at the
// same time as the others), as the Envoy ratelimit service counts each
// descriptor apart, and gets its own status: OK or OVER_LIMIT, the
// descriptor's rate_limit as current_limit, the requests remaining and
// the time until the window renews. A descriptor that matches no
// rate_limit is OK without a limit; an unlimited one is OK with
// limit_remaining 4294967295; a shadow_mode one is OK whatever its count.
// overall_code is OVER_LIMIT when any descriptor is.
//
// hits_addend is each descriptor's cost (0 means 1); a descriptor's own
// hits_addend, when set, overrides it, and 0 there reads the counter
// without counting: OVER_LIMIT when no request of cost 1 would be
// admitted. Unlike the Envoy ratelimit service, a descriptor whose cost
// does not fit is not counted (it would never fit).
//
// A descriptor with usage: true in the file is a budget of usage reported
// after the fact, as Envoy's rate limit filter sends it when a stream ends
// (apply_on_stream_done, hits_addend the tokens used): a call that checks
// it (hits_addend 0) is OVER_LIMIT only once the budget is spent, and a
// call with hits is charged them whatever the counter holds
// (middleware.Limiter.Charge), which may take it past its limit (a debt
// the client waits off: its checks are OVER_LIMIT until then), and is
// answered OK: it refuses nothing, the stream being over.
//
// response_headers_to_add carries the RateLimit and RateLimit-Policy
// fields (and X-RateLimit-* with headers: both or legacy in the file) of
// the descriptor over its limit, or else of the one closest to it;
// RateLimit-Policy lists every limit that applied.
//
// A call without a domain, for a domain not served, or without
// descriptors is answered InvalidArgument. A store failure follows the
// Limiter's failure policy: with FailOpen (and FailLocal) the call is
// answered OK, as the Limiter's observers are told; with FailClosed it is
// answered Unavailable.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	domains []Domain
	timeout time.Duration
}

// NewServer returns a Server for domains, whose files must have been
// parsed with config.Env.RateLimitService and whose domains must differ.
func NewServer(opts Options, domains ...Domain) (*Server, error) {
	if len(domains) == 0 {
		return nil, errors.New("sluice: envoyrls: no domains")
	}
	seen := map[string]bool{}
	for i, d := range domains {
		if d == nil || d.Limiter() == nil || d.Document() == nil {
			return nil, fmt.Errorf("sluice: envoyrls: domains[%d] is nil", i)
		}
		name := d.Document().Domain
		if name == "" {
			return nil, fmt.Errorf("sluice: envoyrls: domains[%d]: %s is not a descriptor file (no domain)", i, d.Document().File)
		}
		if seen[name] {
			return nil, fmt.Errorf("sluice: envoyrls: domains[%d]: domain %q served twice", i, name)
		}
		seen[name] = true
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("sluice: envoyrls: Options.Timeout %v is negative", opts.Timeout)
	}
	t := opts.Timeout
	if t == 0 {
		t = DefaultTimeout
	}
	return &Server{domains: domains, timeout: t}, nil
}

// Register registers s as the RateLimitService of g.
func (s *Server) Register(g grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// domain returns the Domain serving name, if any. Domains are few, and a
// reload may change the name of a file's domain, so it is looked up anew.
func (s *Server) domain(name string) (Domain, bool) {
	for _, d := range s.domains {
		if d.Document().Domain == name {
			return d, true
		}
	}
	return nil, false
}

func (s *Server) domainNames() string {
	names := make([]string, len(s.domains))
	for i, d := range s.domains {
		names[i] = fmt.Sprintf("%q", d.Document().Domain)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// ShouldRateLimit decides the descriptors of req. See Server.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "rate limit descriptor list must not be empty (domain %q)", req.GetDomain())
	}
	d, ok := s.domain(req.GetDomain())
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "unknown rate limit domain %q (this service serves %s)", req.GetDomain(), s.domainNames())
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	descs := make([]config.Descriptor, len(req.Descriptors))
	for i, rd := range req.Descriptors {
		entries := make([]config.DescriptorEntry, len(rd.GetEntries()))
		for j, e := range rd.GetEntries() {
			entries[j] = config.DescriptorEntry{Key: e.GetKey(), Value: e.GetValue()}
		}
		cost := uint64(max(req.GetHitsAddend(), 1))
		if h := rd.GetHitsAddend(); h != nil {
			cost = h.GetValue()
		}
		descs[i] = config.Descriptor{Entries: entries, Cost: int(min(cost, maxCost))}
	}
	lim, usage := d.Limiter(), d.Document().Usage
	out := make([]decision, len(descs))
	if len(descs) == 1 {
		out[0] = decide(ctx, lim, usage, descs, 0)
	} else {
		// Decided at once: the store's round trips overlap (the Redis
		// store sends concurrent decisions together).
		var wg sync.WaitGroup
		for i := 1; i < len(descs); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = decide(ctx, lim, usage, descs, i)
			}()
		}
		out[0] = decide(ctx, lim, usage, descs, 0)
		wg.Wait()
	}
	for i := range out {
		if err := out[i].err; err != nil {
			if errors.Is(err, middleware.ErrStore) {
				return nil, status.Errorf(codes.Unavailable, "rate limit store failed (fail-closed): %v", err)
			}
			return nil, status.Errorf(codes.Internal, "descriptor %d: %v", i, err)
		}
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(out))}
	for i := range out {
		resp.Statuses[i] = out[i].status
		if out[i].status.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	cfg := d.Document()
	style := headers.Draft
	if cfg.HeaderStyleSet() {
		style = cfg.HeaderStyle
	}
	if style != headers.None {
		resp.ResponseHeadersToAdd = responseHeaders(style, out)
	}
	return resp, nil
}

// decision is the outcome of one descriptor.
type decision struct {
	status *rlsv3.RateLimitResponse_DescriptorStatus
	err    error
	// values describe the descriptor's limit for the headers, when one
	// applied and was counted.
	values headers.Values
	// window is the window of the limit values describe.
	window  time.Duration
	limited bool
	over    bool
}

// decide decides descs[i] on lim; usage reports that the file has usage
// descriptors.
func decide(ctx context.Context, lim *middleware.Limiter, usage bool, descs []config.Descriptor, i int) decision {
	r := config.NewDescriptorRequest(ctx, descs, i)
	if descs[i].Cost == 0 {
		return check(ctx, lim, r)
	}
	var res middleware.Result
	var err error
	if isUsage(lim, r, usage) {
		// A usage descriptor: charged, whatever its counter holds.
		res, err = lim.Charge(r)
	} else {
		res, err = lim.Decide(r)
	}
	if err != nil {
		return decision{err: err}
	}
	m, matched := r.Matched()
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	dec := decision{status: st}
	switch {
	case !matched:
		if res.Outcome == middleware.OutcomeUnmatched {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT // the file says unmatched: deny
		}
		return dec
	case m.Unlimited:
		st.LimitRemaining = math.MaxUint32
		return dec
	case m.Limit.Window == 0:
		return dec // allowlisted: neither a limit nor descriptors below
	case res.Outcome == middleware.OutcomeFailedOpen:
		return dec // the store failed: OK, undecided
	}
	st.CurrentLimit = currentLimit(m)
	if !res.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if res.Applied {
		st.LimitRemaining = uint32(min(res.Remaining, math.MaxUint32))
		st.DurationUntilReset = durationpb.New(res.ResetAfter)
		dec.limited, dec.over = true, !res.Allowed
		dec.values = headers.Values{Name: res.Policy, Limit: res.Limit.Requests, Remaining: res.Remaining,
			Reset: res.ResetAfter, Next: res.NextAfter}
		dec.window = res.Limit.Window
		if !res.Allowed {
			dec.values.RetryAfter = res.RetryAfter
		}
	}
	return dec
}

// check reads the counter of the descriptor of r without counting (a
// descriptor hits_addend of 0): OVER_LIMIT when a request of cost 1 would
// not be admitted.
func check(ctx context.Context, lim *middleware.Limiter, r *config.DescriptorRequest) decision {
	rule := matchRule(lim, r, true)
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	dec := decision{status: st}
	m, matched := r.Matched()
	switch {
	case rule == nil || !matched:
		return dec
	case m.Unlimited:
		st.LimitRemaining = math.MaxUint32
		return dec
	case m.Limit.Window == 0:
		return dec
	}
	st.CurrentLimit = currentLimit(m)
	if rule.Deny {
		if !m.Shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		return dec
	}
	key, err := rule.Key(r)
	if err != nil {
		return decision{err: err}
	}
	states, err := lim.Peek(ctx, rule.Name, key)
	if err != nil {
		if lim.FailurePolicy() == middleware.FailClosed {
			return decision{err: err}
		}
		st.CurrentLimit = nil
		return dec
	}
	if len(states) == 0 {
		return dec
	}
	ls := states[0]
	st.LimitRemaining = uint32(min(ls.Remaining, math.MaxUint32))
	st.DurationUntilReset = durationpb.New(ls.ResetAfter)
	if ls.Remaining == 0 && !m.Shadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	dec.limited, dec.over = true, st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
	dec.values = headers.Values{Name: ls.Policy, Limit: ls.Limit.Requests, Remaining: ls.Remaining, Reset: ls.ResetAfter, Next: ls.NextAfter}
	dec.window = ls.Limit.Window
	if dec.over {
		dec.values.RetryAfter = ls.NextAfter
	}
	return dec
}

// matchRule returns the rule of lim that applies to r, when look is set
// (nil if none, or if look is not set), leaving r's Matched to tell what
// the file says of it.
func matchRule(lim *middleware.Limiter, r *config.DescriptorRequest, look bool) *middleware.Rule {
	if !look {
		return nil
	}
	rules := lim.Rules()
	for i := range rules {
		if rules[i].Match != nil && rules[i].Match(r) {
			return &rules[i]
		}
	}
	return nil
}

// isUsage reports whether r is a descriptor with usage: true, when the
// file has any (look).
func isUsage(lim *middleware.Limiter, r *config.DescriptorRequest, look bool) bool {
	if matchRule(lim, r, look) == nil {
		return false
	}
	m, _ := r.Matched()
	return m.Usage
}

// currentLimit is the current_limit of a descriptor's rate_limit.
func currentLimit(m config.DescriptorMatch) *rlsv3.RateLimitResponse_RateLimit {
	return &rlsv3.RateLimitResponse_RateLimit{
		Name:            m.Rule,
		RequestsPerUnit: uint32(min(m.Limit.Requests, math.MaxUint32)),
		Unit:            unitOf(m.Limit.Window),
	}
}

func unitOf(w time.Duration) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch w {
	case time.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case time.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case 24 * time.Hour:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// responseHeaders returns the rate-limit fields of style for the
// descriptor over its limit with the longest wait, or else the one with
// the fewest requests remaining; RateLimit-Policy lists every limit that
// was counted.
func responseHeaders(style headers.Style, out []decision) []*corev3.HeaderValue {
	best := -1
	var policies []headers.Policy
	for i := range out {
		d := &out[i]
		if !d.limited {
			continue
		}
		p := headers.Policy{Name: d.values.Name, Quota: d.values.Limit, Window: d.window}
		if !containsPolicy(policies, p) {
			policies = append(policies, p)
		}
		switch {
		case best < 0:
		case d.over != out[best].over:
			if !d.over {
				continue
			}
		case d.over:
			if d.values.RetryAfter <= out[best].values.RetryAfter {
				continue
			}
		case d.values.Remaining >= out[best].values.Remaining:
			continue
		}
		best = i
	}
	if best < 0 {
		return nil
	}
	v := out[best].values
	v.Policy = headers.FormatPolicies(policies...)
	var hs headerList
	headers.Write(&hs, style, &v)
	return hs
}

func containsPolicy(ps []headers.Policy, p headers.Policy) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// headerList collects the fields headers.Write sets, as Envoy adds them
// to the response.
type headerList []*corev3.HeaderValue

// Set sets the field named key to value, replacing an earlier value.
func (l *headerList) Set(key, value string) {
	for _, h := range *l {
		if h.Key == key {
			h.Value = value
			return
		}
	}
	*l = append(*l, &corev3.HeaderValue{Key: key, Value: value})
}
