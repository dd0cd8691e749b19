package middleware

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/internal/pathmatch"
	"github.com/sluicehq/sluice/internal/rulename"
	"github.com/sluicehq/sluice/keyfunc"
)

// Rule says which requests are limited, who they are counted against and how
// much they may do. Every rule that matches a request applies; the request
// passes only if every limit of every matching rule admits it, and a denied
// request is charged to none of them.
type Rule struct {
	// Name identifies the rule in headers (RateLimit-Policy), hooks and
	// store keys. It must match [A-Za-z0-9_.-]{1,64} and be unique among a
	// limiter's rules. Counters are kept per rule name, so renaming a rule
	// starts its counters afresh.
	Name string

	// Path selects requests by their cleaned URL path: "" or "/*" matches
	// every path, "/api/login" only that path, "/api/*" "/api" and every
	// path below it, and "/users/{id}/posts" (or "/users/*/posts") any one
	// segment in place of {id}.
	Path string

	// Methods, when not empty, limits the rule to these HTTP methods. A
	// rule for GET also matches HEAD, which net/http serves with the GET
	// handler.
	Methods []string

	// Headers, when not empty, limits the rule to requests that carry each
	// of these headers with exactly this value (the header's first value;
	// names are case-insensitive), as in {"X-Tenant": "gold"}.
	Headers map[string]string

	// Query, when not empty, limits the rule to requests whose URL has
	// each of these query parameters with exactly this value (the
	// parameter's first value, unescaped), as in {"plan": "free"}. A front
	// end whose Request does not implement keyfunc.QueryRequest matches no
	// such rule; net/http and the adapters all do.
	Query map[string]string

	// Match, when set, limits the rule further to the requests for which
	// it reports true, on top of Path, Methods, Headers and Query. Unlike
	// Skip, a request Match rejects is one the rule does not apply to at
	// all (see WithUnmatched). It is called on every request the other
	// conditions select and must be fast.
	Match func(r keyfunc.Request) bool

	// Deny, when set, turns away every request the rule applies to (once
	// its key is found and not allowlisted) with 429 Too Many Requests and
	// no Retry-After, charging nothing: a blocklist entry, such as an
	// Envoy descriptor with requests_per_unit: 0. A Deny rule has no
	// Limits, LimitsFunc or Concurrency; a shadow Deny rule only reports
	// the requests it would have denied.
	Deny bool

	// Key says who a request is counted against. Required.
	Key keyfunc.Func

	// Limits are the limits that apply to each key, such as PerSecond(10)
	// and PerHour(1000) at once. At least one is required unless LimitsFunc
	// is set.
	Limits []Limit

	// LimitsFunc, when set, returns the limits for a request and its key,
	// for example from the plan of an API key looked up in memory. It is
	// called on every matching request and must be fast; it replaces
	// Limits, and returning no limits leaves the request unlimited by this
	// rule. Returned limits are validated on every call; an invalid one is
	// an error for the request (see WithErrorHandler).
	LimitsFunc func(r keyfunc.Request, key string) []Limit

	// Cost is how many units each matching request consumes; 0 means 1.
	Cost int

	// CostFunc, when set, computes the cost from the request (for example
	// from the route or the body size) and replaces Cost. A cost below 1
	// counts as 1; a cost above a limit is denied with 429 and no
	// Retry-After, since waiting would not help.
	CostFunc func(r keyfunc.Request) int

	// Overage lets a limit admit this fraction more than its nominal value
	// (0.1 lets 110 requests of a 100/min limit through), while headers
	// keep reporting the nominal limit: a soft throttle for clients that
	// burst a little. 0 means none.
	Overage float64

	// Skip, when it reports true, leaves the request unlimited by this rule.
	Skip func(r keyfunc.Request) bool

	// AllowKeys are keys (as the rule's key function returns them, such as
	// "user:admin" or "ip:192.0.2.10") that this rule never limits.
	AllowKeys []string

	// AllowCIDRs are networks whose clients this rule never limits. They
	// are checked against every IP part ("ip:...") of the rule's key, so
	// the rule's key function decides which IP counts: RemoteIP for the
	// peer, ClientIP for the client behind trusted proxies. A key without
	// an IP part is never allowlisted by CIDR.
	AllowCIDRs []netip.Prefix

	// Shadow computes, counts and reports this rule's decisions (to
	// Observer.Decided) but never denies a request: for rolling out a new
	// limit safely. Shadow rules are counted in a separate store call.
	Shadow bool

	// Concurrency, when > 0, lets at most this many requests of one key
	// be in flight at once under this rule, on top of its Limits (a rule
	// may have only a concurrency limit). A request takes a slot before
	// the handler runs and gives it back when the handler returns, panics
	// or sees its client go away; one that finds every slot taken is
	// denied at once (ConcurrencyStatus, 429 by default) with a
	// Retry-After of ConcurrencyRetryAfter, and is charged to no rate
	// limit. On Redis, slots are leases that the limiter renews while the
	// request runs, so that the slots of an app server that dies come back
	// (WithConcurrencyLease). It needs a store that implements SlotStore.
	Concurrency int

	// ConcurrencyStatus is the status of a request denied by Concurrency:
	// 429 Too Many Requests (the default, 0) or 503 Service Unavailable.
	ConcurrencyStatus int

	// Sync is how the app servers that share the Redis store coordinate
	// this rule's counters: SyncExact (the default) decides every request
	// in Redis; SyncLease and SyncWriteBack decide in memory and keep the
	// fleet's count in Redis in the background (with another store than
	// NewRedisStore's, such as the in-memory one, every mode decides
	// exactly), each with the bound on its
	// error that its doc states (see docs/fleet.md). They take sliding
	// windows, fixed windows and token buckets; a rule with another
	// algorithm in another mode than SyncExact is an error (limits from a
	// LimitsFunc with another algorithm are decided exactly). Remaining
	// then comes from the app server's own view. Counters stay where
	// exact mode keeps them, so a rule may change modes without resetting
	// its clients.
	Sync SyncMode
	// Lease is, for SyncLease, the largest slice an app server reserves
	// at once, in cost units; 0 means DefaultLease.
	Lease int
	// SyncInterval is, for SyncWriteBack, how often deltas are pushed and,
	// for SyncLease, how long a slice lives; 0 means DefaultSyncInterval.
	// For ScopeGlobal, it is how often the region's counts are written to
	// the peer regions; 0 means DefaultRegionSyncInterval.
	SyncInterval time.Duration
	// MaxUnsynced is, for SyncWriteBack, how many units one app server
	// may count on one counter before it pushes them at once and waits
	// for the answer; 0 means Requests / 10, between 1 and
	// MaxMaxUnsynced.
	MaxUnsynced int

	// Count, when set, charges the rule's limits only for requests whose
	// response status it matches, such as failed logins; see Count.
	Count Count
	// Scope is whose budget the rule's limits are when app servers run in
	// several regions with a RegionStore: ScopeRegion (the default), the
	// region's; ScopeGlobal, one budget across regions synced in the
	// background every SyncInterval; ScopeGlobalStrict, one budget decided
	// in the home region. With another store every scope is the store's.
	// See Scope and docs/regions.md.
	Scope Scope

	// AdaptiveConcurrency, when set, bounds the requests of this rule in
	// flight in this app server by a limit that follows their latency
	// (see AdaptiveConcurrency), shedding them by Priority. A rule may
	// have only that; it then needs no Key.
	AdaptiveConcurrency *AdaptiveConcurrency

	// Priority is the priority of the requests this rule applies to, for
	// shedding under adaptive concurrency limits: a request takes the
	// highest of the rules that apply to it, unless WithPriority decides.
	// A rule may have only a Priority; it then needs no Key.
	Priority Priority
}

// compiledRule is a validated Rule with everything constant precomputed.
type compiledRule struct {
	Rule
	match   pathmatch.Matcher
	methods uint16 // bitmask of knownMethods, 0 = all
	other   []string
	limits  []Limit // effective limits (with overage) for static rules
	nominal []Limit
	policy  string // RateLimit-Policy value for static rules
	names   []string
	allow   map[string]struct{}
	headers []condition // Headers, names canonical
	query   []condition // Query
	extra   bool        // the rule has Headers, Query or Match
	// prepared holds the fixed header text of each limit of a static rule.
	prepared []*headerwrite.Prepared
	// ctrl is the controller of AdaptiveConcurrency, bound by SetRules.
	ctrl *controller
	// elastic reports that a limit has a ceiling; overloadRule that the
	// rule has AdaptiveConcurrency or a Priority, and overloadOnly that it
	// has nothing else.
	elastic, overloadRule, overloadOnly bool
}

// condition is one header or query parameter a rule requires.
type condition struct{ name, value string }

var knownMethods = [...]string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

func compileRule(r Rule) (*compiledRule, error) {
	if !rulename.Valid(r.Name) {
		return nil, fmt.Errorf("rule %q: name must match %s", r.Name, rulename.Pattern)
	}
	errorf := func(format string, args ...any) error {
		return fmt.Errorf("rule %q: "+format, append([]any{r.Name}, args...)...)
	}
	counts := len(r.Limits) > 0 || r.LimitsFunc != nil || r.Concurrency != 0
	overload := r.AdaptiveConcurrency != nil || r.Priority != PriorityUnset
	if r.Key == nil && (counts || r.Deny || !overload) {
		return nil, errorf("key function is nil")
	}
	if r.Deny {
		if counts || overload {
			return nil, errorf("a Deny rule has no limits, LimitsFunc, concurrency or priority")
		}
	} else if !counts && !overload {
		return nil, errorf("no limits")
	}
	if r.Concurrency < 0 {
		return nil, errorf("concurrency %d is negative", r.Concurrency)
	}
	switch r.ConcurrencyStatus {
	case 0, http.StatusTooManyRequests, http.StatusServiceUnavailable:
	default:
		return nil, errorf("concurrency status %d: want 429 or 503", r.ConcurrencyStatus)
	}
	if r.Cost < 0 {
		return nil, errorf("cost %d is negative", r.Cost)
	}
	if r.Overage < 0 || r.Overage > 10 {
		return nil, errorf("overage %g must be between 0 and 10", r.Overage)
	}
	m, err := pathmatch.Compile(r.Path)
	if err != nil {
		return nil, errorf("path %v", err)
	}
	c := &compiledRule{Rule: r, match: m, overloadRule: overload}
	if err := c.compileConditions(); err != nil {
		return nil, errorf("%v", err)
	}
	if err := c.compileOverload(); err != nil {
		return nil, errorf("%v", err)
	}
	if err := c.compileSync(); err != nil {
		return nil, errorf("%v", err)
	}
	if err := c.compileCount(); err != nil {
		return nil, errorf("%v", err)
	}
	if err := c.compileScope(); err != nil {
		return nil, errorf("%v", err)
	}
	c.Limits = append([]Limit(nil), r.Limits...)
	c.AllowCIDRs = append([]netip.Prefix(nil), r.AllowCIDRs...)
	for _, p := range c.AllowCIDRs {
		if !p.IsValid() {
			return nil, errorf("invalid allowlist CIDR %v", p)
		}
	}
	if len(r.AllowKeys) > 0 {
		c.allow = make(map[string]struct{}, len(r.AllowKeys))
		for _, k := range r.AllowKeys {
			c.allow[k] = struct{}{}
		}
	}
	c.Methods = append([]string(nil), r.Methods...)
	for _, meth := range r.Methods {
		if meth == "" || strings.ContainsAny(meth, " \t/") {
			return nil, errorf("bad method %q", meth)
		}
		meth = strings.ToUpper(meth)
		known := false
		for i, k := range knownMethods {
			if k == meth {
				c.methods |= 1 << i
				known = true
			}
		}
		if !known {
			c.other = append(c.other, meth)
		}
	}
	if c.methods&(1<<0) != 0 { // GET
		c.methods |= 1 << 1 // HEAD
	}
	windows := map[string]bool{}
	for _, l := range c.Limits {
		if err := l.Validate(); err != nil {
			return nil, errorf("%v", err)
		}
		if w := windowName(l); windows[w] {
			return nil, errorf("two limits with window %s; one limit per window", w)
		} else {
			windows[w] = true
		}
		if r.Cost > l.Capacity() {
			return nil, errorf("cost %d exceeds limit %s: no request could ever pass", r.Cost, l)
		}
		eff, err := withOverage(l, r.Overage)
		if err != nil {
			return nil, errorf("%v", err)
		}
		c.limits = append(c.limits, eff)
		c.nominal = append(c.nominal, l)
	}
	if len(c.Limits) > 0 && r.LimitsFunc == nil {
		ps := make([]headers.Policy, len(c.Limits))
		for i, l := range c.Limits {
			c.names = append(c.names, policyName(r.Name, l, len(c.Limits)))
			ps[i] = policyOf(c.names[i], l)
			c.prepared = append(c.prepared, headerwrite.Prepare(c.names[i], l.Capacity()))
		}
		c.policy = headers.FormatPolicies(ps...)
	}
	return c, nil
}

// policyOf is the RateLimit-Policy item of limit l named name: its
// capacity per its span (see Limit.Capacity and Limit.Span).
func policyOf(name string, l Limit) headers.Policy {
	return headers.Policy{Name: name, Quota: l.Capacity(), Window: l.Span()}
}

// withOverage raises l by the fraction o: its requests and, for a token
// bucket with a burst, its burst.
func withOverage(l Limit, o float64) (Limit, error) {
	if o == 0 {
		return l, nil
	}
	// The epsilon keeps 100 * 0.29 = 28.999999999999996 from truncating
	// to 28.
	l.Requests += int(math.Floor(float64(l.Requests)*o + 1e-9))
	if l.Burst > 0 {
		l.Burst += int(math.Floor(float64(l.Burst)*o + 1e-9))
	}
	if err := l.Validate(); err != nil {
		return l, fmt.Errorf("with overage: %v", err)
	}
	return l, nil
}

// policyName names the policy of limit l of a rule: the rule's name, or for
// a rule with several limits the name and the window ("api-1s",
// "api-calendar_day").
func policyName(rule string, l Limit, n int) string {
	if n == 1 {
		return rule
	}
	return rule + "-" + windowName(l)
}

// windowName names a limit's window as the rules file spells it: "1s",
// "1h", "1d", "calendar_day".
func windowName(l Limit) string { return l.internal().WindowName() }

// allowed reports whether key is on the rule's allowlist.
func (c *compiledRule) allowed(key string) bool {
	if _, ok := c.allow[key]; ok {
		return true
	}
	if len(c.AllowCIDRs) == 0 {
		return false
	}
	for part := range strings.SplitSeq(key, "|") {
		ip, ok := strings.CutPrefix(part, "ip:")
		if !ok {
			continue
		}
		var p netip.Prefix
		if a, err := netip.ParseAddr(ip); err == nil {
			p = netip.PrefixFrom(a, a.BitLen())
		} else if p, err = netip.ParsePrefix(ip); err != nil {
			continue
		}
		for _, n := range c.AllowCIDRs {
			if n.Bits() <= p.Bits() && n.Contains(p.Addr()) {
				return true
			}
		}
	}
	return false
}

// matches reports whether the rule applies to a request with this method and
// cleaned path.
func (c *compiledRule) matches(method, cleanPath string) bool {
	if c.methods != 0 || len(c.other) > 0 {
		ok := false
		for i, k := range knownMethods {
			if c.methods&(1<<i) != 0 && k == method {
				ok = true
				break
			}
		}
		for _, o := range c.other {
			ok = ok || o == method
		}
		if !ok {
			return false
		}
	}
	return c.match.Match(cleanPath)
}

// compileConditions checks and copies the rule's Headers and Query.
func (c *compiledRule) compileConditions() error {
	headers, query := c.Headers, c.Query
	c.Headers, c.Query = nil, nil
	for _, name := range sortedNames(headers) {
		if !httptoken.Valid(name) {
			return fmt.Errorf("bad header name %q", name)
		}
		c.headers = append(c.headers, condition{http.CanonicalHeaderKey(name), headers[name]})
	}
	for _, name := range sortedNames(query) {
		if name == "" {
			return errors.New("empty query parameter name")
		}
		c.query = append(c.query, condition{name, query[name]})
	}
	if len(c.headers) > 0 {
		c.Headers = make(map[string]string, len(c.headers))
		for _, h := range c.headers {
			c.Headers[h.name] = h.value
		}
	}
	if len(c.query) > 0 {
		c.Query = make(map[string]string, len(c.query))
		for _, q := range c.query {
			c.Query[q.name] = q.value
		}
	}
	c.extra = len(c.headers) > 0 || len(c.query) > 0 || c.Match != nil
	return nil
}

// matchesExtra reports whether r satisfies the rule's Headers, Query and
// Match.
func (c *compiledRule) matchesExtra(r keyfunc.Request) bool {
	for _, h := range c.headers {
		if r.Header(h.name) != h.value {
			return false
		}
	}
	if len(c.query) > 0 {
		q, ok := r.(keyfunc.QueryRequest)
		if !ok {
			return false
		}
		for _, p := range c.query {
			if q.Query(p.name) != p.value {
				return false
			}
		}
	}
	return c.Match == nil || c.Match(r)
}

// sortedNames returns the keys of m in order.
func sortedNames(m map[string]string) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
