package middleware

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/internal/pathmatch"
	"github.com/sluicehq/sluice/internal/rulename"
	"github.com/sluicehq/sluice/internal/usage"
	"github.com/sluicehq/sluice/keyfunc"
)

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
	// usage is the rule's Usage, checked; nil if none.
	usage *compiledUsage
	// ctrl is the controller of AdaptiveConcurrency, bound by SetRules.
	ctrl *controller
	// elastic reports that a limit has a ceiling; overloadRule that the
	// rule has AdaptiveConcurrency or a Priority, and overloadOnly that it
	// has nothing else.
	elastic, overloadRule, overloadOnly bool
	// top is the rule's sampling gates for the top-client tracker, bound
	// by SetRules; nil when the rule is not tracked.
	top *hitters.Gates
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
	counts := len(r.Limits) > 0 || r.LimitsFunc != nil || r.Concurrency != 0 || r.Usage != nil
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
	if r.TopClients == 1 {
		return nil, errorf("TopClients 1: a summary needs at least 2 counters (0 for the limiter's, -1 for none)")
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
	if err := c.compileUsage(); err != nil {
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
	if u := c.usage; u != nil && c.policy != "" {
		// One RateLimit-Policy value for both kinds of charges, so that
		// a request does not join them.
		c.policy += ", " + u.policy
		u.policy = c.policy
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

// compiledUsage is a rule's Usage, checked, with what its charges need.
type compiledUsage struct {
	Usage
	rule     string // the rule's name
	name     string // the counters' Name: rule~unit
	max      int
	names    []string // the policies, one per limit
	policy   string   // their RateLimit-Policy items
	prepared []*headerwrite.Prepared
}

var unitPattern = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// compileUsage checks the rule's Usage.
func (c *compiledRule) compileUsage() error {
	if c.Usage == nil {
		return nil
	}
	u := &compiledUsage{Usage: *c.Usage, rule: c.Name}
	u.Limits = append([]Limit(nil), c.Usage.Limits...)
	switch {
	case !unitPattern.MatchString(u.Unit):
		return fmt.Errorf("usage: unit %q must match [a-z0-9_]{1,32}", u.Unit)
	case len(u.Limits) == 0:
		return fmt.Errorf("usage: no limits")
	case c.Deny:
		return fmt.Errorf("usage: a Deny rule charges nothing to settle")
	case c.Shadow:
		return fmt.Errorf("usage: a shadow rule cannot settle usage")
	case !c.Count.IsZero():
		return fmt.Errorf("usage: a rule cannot both count by outcome and settle usage; use two rules")
	case u.Estimate < 0:
		return fmt.Errorf("usage: estimate %d is negative", u.Estimate)
	case u.Max < 0:
		return fmt.Errorf("usage: max %d is negative", u.Max)
	case u.Header != "" && !httptoken.Valid(u.Header):
		return fmt.Errorf("usage: bad header name %q", u.Header)
	}
	windows := map[string]bool{}
	smallest := 0
	for i, l := range u.Limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("usage: %v", err)
		}
		switch {
		case l.Algorithm == LeakyBucket:
			return fmt.Errorf("usage: limits[%d]: a leaky_bucket cannot settle usage (it queues requests); use a sliding_window, fixed_window, token_bucket or sliding_log", i)
		case l.Ceiling != 0:
			return fmt.Errorf("usage: limits[%d]: a usage limit cannot be elastic (ceiling)", i)
		case l.Ban != 0:
			return fmt.Errorf("usage: limits[%d]: a usage limit cannot ban; put the ban on the rule's limits", i)
		}
		if w := windowName(l); windows[w] {
			return fmt.Errorf("usage: two limits with window %s; one limit per window", w)
		} else {
			windows[w] = true
		}
		if smallest == 0 || l.Capacity() < smallest {
			smallest = l.Capacity()
		}
	}
	u.max = u.Max
	if u.max == 0 {
		u.max = smallest
	}
	if u.max > usage.MaxUnits {
		return fmt.Errorf("usage: max %d is more than 2^50", u.Max)
	}
	u.name = c.Name + usageSuffix + u.Unit
	ps := make([]headers.Policy, len(u.Limits))
	for i, l := range u.Limits {
		u.names = append(u.names, policyName(c.Name+"-"+u.Unit, l, len(u.Limits)))
		ps[i] = policyOf(u.names[i], l)
		u.prepared = append(u.prepared, headerwrite.Prepare(u.names[i], l.Capacity()))
	}
	u.policy = headers.FormatPolicies(ps...)
	c.usage = u
	return nil
}

// usageLimits returns the rule's usage limits, nil if it has none.
func (c *compiledRule) usageLimits() []Limit {
	if c.usage == nil {
		return nil
	}
	return c.usage.Limits
}
