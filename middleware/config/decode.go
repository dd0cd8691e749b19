package config

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/internal/pathmatch"
	"github.com/sluicehq/sluice/internal/rulename"
	"github.com/sluicehq/sluice/internal/window"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// maxNodes bounds the number of YAML nodes of a file, counting each alias as
// the nodes it refers to, so that a file of nested aliases (a "billion
// laughs") cannot make the loader walk an exponential tree.
const maxNodes = 1 << 17

// The fields of each mapping of the schema, in the order error messages
// list them.
var (
	rootFields  = []string{"rules", "headers", "shadow", "allow", "unmatched"}
	ruleFields  = []string{"name", "match", "key", "limits", "algorithm", "time_zone", "concurrency", "concurrency_status", "cost", "overage", "shadow", "allow", "plans", "adaptive_concurrency", "priority", "count", "sync", "lease", "sync_interval", "max_unsynced", "scope", "usage", "top_clients"}
	matchFields = []string{"path", "methods", "headers", "query"}
	limitFields = []string{"requests", "window", "algorithm", "burst", "max_delay", "time_zone", "max_log", "ceiling", "ban"}
	allowFields = []string{"cidrs", "keys"}
)

// maxTopClients bounds a rule's top_clients: each counter is kept in 28
// buckets (see middleware.TopConfig).
const maxTopClients = 10_000

// standardMethods are the methods a rule may name.
var standardMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// decoder turns the nodes of a rules file into a Document, collecting errors
// as it goes.
type decoder struct {
	file  string
	env   *Env
	errs  []*Error
	nerrs int
	keys  keyCache
}

// errorf records a problem at node n in field.
func (d *decoder) errorf(n *yaml.Node, field, format string, args ...any) {
	d.nerrs++
	d.errs = append(d.errs, &Error{File: d.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// ok reports whether no error was recorded since there were n.
func (d *decoder) ok(n int) bool { return d.nerrs == n }

// err returns the recorded errors in the order of their lines, at most
// maxErrors of them, or nil.
func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	slices.SortStableFunc(d.errs, func(a, b *Error) int { return a.Line - b.Line })
	var errs []error
	for i, e := range d.errs {
		if i == maxErrors {
			errs = append(errs, &Error{File: d.file, Msg: fmt.Sprintf("%d more errors", len(d.errs)-maxErrors)})
			break
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// root decodes the top-level mapping.
func (d *decoder) root(n *yaml.Node) *Document {
	cfg := &Document{File: d.file}
	if err := checkSize(n); err != "" {
		d.errorf(n, "", "%s", err)
		return cfg
	}
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "", "want a mapping with rules, got %s", describe(n))
		return cfg
	}
	if isDescriptorFile(n) {
		d.descriptorRoot(n, cfg)
		return cfg
	}
	var rules, allow *yaml.Node
	d.fields(n, "", rootFields, func(key string, v *yaml.Node) {
		switch key {
		case "rules":
			rules = v
		case "headers":
			d.headerStyle(v, cfg)
		case "unmatched":
			d.unmatched(v, cfg)
		case "shadow":
			cfg.Shadow, _ = d.bool(v, "shadow")
		case "allow":
			allow = v
		}
	})
	var global allowList
	if allow != nil {
		global = d.allow(allow, "allow")
	}
	if rules == nil {
		d.errorf(n, "rules", "required")
		return cfg
	}
	if !d.seq(rules, "rules") {
		return cfg
	}
	if len(rules.Content) == 0 {
		d.errorf(rules, "rules", "empty: want at least one rule")
		return cfg
	}
	names := map[string]int{}
	for i, rn := range rules.Content {
		path := "rules[" + strconv.Itoa(i) + "]"
		r, nameNode, ok := d.rule(resolve(rn), path, &global, cfg.Shadow)
		if nameNode != nil {
			if line, dup := names[r.Name]; dup {
				d.errorf(nameNode, path+".name", "%q used twice (first at line %d)", r.Name, line)
				ok = false
			} else {
				names[r.Name] = nameNode.Line
			}
		}
		if ok {
			cfg.Rules = append(cfg.Rules, r)
		}
	}
	return cfg
}

// rule decodes one rule. It returns the name's node (nil when the name is
// missing or bad) and whether the rule is valid.
func (d *decoder) rule(n *yaml.Node, path string, global *allowList, shadow bool) (middleware.Rule, *yaml.Node, bool) {
	r := middleware.Rule{Shadow: shadow}
	start := d.nerrs
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping, got %s", describe(n))
		return r, nil, false
	}
	var nameNode, keyNode, limitsNode, costNode, overageNode, plansNode, concNode, concStatusNode *yaml.Node
	var allow allowList
	var key keyExpr
	var limits []middleware.Limit
	var plans map[string][]middleware.Limit
	// The rule's algorithm and time zone are defaults for its limits, so
	// limits and plans are decoded once every field has been seen.
	var defaults limitDefaults
	var sf syncFields
	var sc scopeFields
	d.fields(n, path, ruleFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		switch field {
		case "name":
			s, ok := d.str(v, fpath)
			if !ok {
				return
			}
			if !rulename.Valid(s) {
				d.errorf(v, fpath, "bad name %q: want 1 to 64 of A-Z a-z 0-9 _ . -", s)
				return
			}
			r.Name, nameNode = s, v
		case "match":
			r.Path, r.Methods, r.Headers, r.Query = d.match(v, fpath)
		case "key":
			s, ok := d.str(v, fpath)
			if !ok {
				return
			}
			k, err := d.keys.parse(s, d.env)
			if err != nil {
				d.errorf(v, fpath, "%v", err)
				return
			}
			key, keyNode, r.Key = k, v, k.fn
		case "limits":
			limitsNode = v
		case "algorithm":
			if a, ok := d.algorithm(v, fpath); ok {
				defaults.algorithm, defaults.algorithmNode = a, v
			}
		case "time_zone":
			if loc, ok := d.timeZone(v, fpath); ok {
				defaults.location, defaults.locationNode = loc, v
			}
		case "concurrency":
			if c, ok := d.int(v, fpath); ok {
				if c < 1 {
					d.errorf(v, fpath, "%d must be at least 1", c)
					return
				}
				r.Concurrency, concNode = c, v
			}
		case "concurrency_status":
			if c, ok := d.int(v, fpath); ok {
				if c != 429 && c != 503 {
					d.errorf(v, fpath, "%d: want 429 or 503", c)
					return
				}
				r.ConcurrencyStatus, concStatusNode = c, v
			}
		case "cost":
			if c, ok := d.int(v, fpath); ok {
				if c < 1 {
					d.errorf(v, fpath, "%d must be at least 1", c)
					return
				}
				r.Cost, costNode = c, v
			}
		case "overage":
			if o, ok := d.float(v, fpath); ok {
				if !(o >= 0 && o <= 10) {
					d.errorf(v, fpath, "%g must be between 0 and 10 (a fraction: 0.1 admits 10%% more)", o)
					return
				}
				r.Overage, overageNode = o, v
			}
		case "shadow":
			if b, ok := d.bool(v, fpath); ok {
				r.Shadow = r.Shadow || b
			}
		case "allow":
			allow = d.allow(v, fpath)
		case "plans":
			plansNode = v
		case "sync", "lease", "sync_interval", "max_unsynced":
			d.syncField(&sf, field, v, fpath)
		case "adaptive_concurrency": // overload.go
			r.AdaptiveConcurrency = d.adaptiveConcurrency(v, fpath)
		case "priority":
			r.Priority, _ = d.priority(v, fpath)
		case "count":
			r.Count = d.count(v, fpath)
		case "top_clients":
			if n, ok := d.int(v, fpath); ok {
				if n != -1 && (n < 2 || n > maxTopClients) {
					d.errorf(v, fpath, "%d: want -1 (no top clients), or 2 to %d counters", n, maxTopClients)
					return
				}
				r.TopClients = n
			}
		case "usage": // usage.go
			r.Usage = d.usage(v, fpath)
		case "scope":
			d.scopeField(&sc, v, fpath)
		}
	})
	if limitsNode != nil {
		limits = d.limits(limitsNode, path+".limits", &defaults)
	}
	if plansNode != nil {
		plans = d.plans(plansNode, path+".plans", &defaults)
	}
	if defaults.locationNode != nil && !defaults.usedLocation && d.ok(start) {
		d.errorf(defaults.locationNode, path+".time_zone", "no limit of the rule has a calendar window (calendar_day, calendar_week or calendar_month)")
	}
	if nameNode == nil && d.ok(start) {
		d.errorf(n, path+".name", "required")
	}
	if keyNode == nil && d.ok(start) && !overloadOnly(&r, limitsNode, concNode, plansNode) {
		d.errorf(n, path+".key", "required")
	}
	if limitsNode == nil && concNode == nil && r.Usage == nil && d.ok(start) && !overloadOnly(&r, limitsNode, concNode, plansNode) {
		d.errorf(n, path+".limits", "required (the limits of the default plan when the rule has plans), unless the rule has a concurrency limit or usage limits")
	}
	if plansNode != nil && limitsNode == nil && d.ok(start) {
		d.errorf(plansNode, path+".plans", "needs limits, the default plan's")
	}
	if concStatusNode != nil && concNode == nil && d.ok(start) {
		d.errorf(concStatusNode, path+".concurrency_status", "applies only to a rule with concurrency")
	}
	if !d.ok(start) {
		return r, nameNode, false
	}
	r.Limits = limits
	d.checkScope(&sc, &sf, &r, limits, plans, path)
	d.checkSync(&sf, &r, limits, plans, path)

	// Checks that span fields.
	d.checkOverload(&r, overageNode, path)
	d.checkLimits(limits, limitsNode, path+".limits", r.Cost, costNode, r.Overage, overageNode, path)
	for _, name := range sortedKeys(plans) {
		d.checkLimits(plans[name], plansNode, path+".plans."+name, r.Cost, costNode, r.Overage, overageNode, path)
	}
	if plansNode != nil {
		if d.env.Plan == nil {
			d.errorf(plansNode, path+".plans", "the program supplies no Env.Plan to choose a plan")
		} else {
			r.LimitsFunc = plansFunc(d.env.Plan, plans, limits)
		}
	}
	if len(allow.cidrs) > 0 && !key.mayHaveIP {
		d.errorf(allow.cidrsNode, path+".allow.cidrs", "key %q has no address to check the CIDRs against", keyNode.Value)
	}
	r.AllowCIDRs = append(slices.Clone(global.cidrs), allow.cidrs...)
	r.AllowKeys = append(slices.Clone(global.keys), allow.keys...)
	return r, nameNode, d.ok(start)
}

// checkLimits checks the limits of a rule (or of one of its plans) against
// its cost and overage.
func (d *decoder) checkLimits(limits []middleware.Limit, at *yaml.Node, field string, cost int, costNode *yaml.Node, overage float64, overageNode *yaml.Node, path string) {
	for i, l := range limits {
		if cost > l.Capacity() {
			d.errorf(costNode, path+".cost", "%d exceeds %s[%d] (%s): no request could ever pass", cost, field, i, formatLimit(l))
		}
		if overage > 0 {
			// Rounded up, so that the check is at least as strict as the
			// Limiter's, whichever way it rounds.
			eff := l
			eff.Requests += int(math.Ceil(float64(l.Requests) * overage))
			if eff.Burst > 0 {
				eff.Burst += int(math.Ceil(float64(l.Burst) * overage))
			}
			if err := eff.Validate(); err != nil {
				d.errorf(overageNode, path+".overage", "%g makes %s[%d] too large: %v", overage, field, i, err)
			}
		}
	}
}

// plansFunc returns a Rule.LimitsFunc that looks up the plan of a request in
// plans, falling back to def.
func plansFunc(plan func(keyfunc.Request, string) string, plans map[string][]middleware.Limit, def []middleware.Limit) func(keyfunc.Request, string) []middleware.Limit {
	return func(r keyfunc.Request, key string) []middleware.Limit {
		if l, ok := plans[plan(r, key)]; ok {
			return l
		}
		return def
	}
}

// match decodes a rule's match field.
func (d *decoder) match(n *yaml.Node, path string) (p string, methods []string, hdrs, query map[string]string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {path: /api/*, methods: [GET]}, got %s", describe(n))
		return "", nil, nil, nil
	}
	d.fields(n, path, matchFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		switch field {
		case "path":
			s, ok := d.str(v, fpath)
			if !ok {
				return
			}
			if _, err := pathmatch.Compile(s); err != nil {
				d.errorf(v, fpath, "%v", err)
				return
			}
			p = s
		case "headers":
			hdrs = d.values(v, fpath, "{X-Tenant: gold}", true, func(name string) string {
				if !httptoken.Valid(name) {
					return fmt.Sprintf("bad header name %q", name)
				}
				return ""
			})
		case "query":
			query = d.values(v, fpath, "{plan: free}", false, func(string) string { return "" })
		case "methods":
			if !d.seq(v, fpath) {
				return
			}
			if len(v.Content) == 0 {
				d.errorf(v, fpath, "empty: leave methods out to match every method")
				return
			}
			for i, mn := range v.Content {
				mn = resolve(mn)
				ipath := fpath + "[" + strconv.Itoa(i) + "]"
				s, ok := d.str(mn, ipath)
				if !ok {
					continue
				}
				m := strings.ToUpper(s)
				switch {
				case !slices.Contains(standardMethods, m):
					d.errorf(mn, ipath, "unknown method %q (want %s)", s, strings.Join(standardMethods, ", "))
				case slices.Contains(methods, m):
					d.errorf(mn, ipath, "%s listed twice", m)
				default:
					methods = append(methods, m)
				}
			}
		}
	})
	return p, methods, hdrs, query
}

// values decodes a mapping of names to exact values, as match's headers
// and query are; fold makes names case-insensitive. check reports a bad
// name, or "".
func (d *decoder) values(n *yaml.Node, path, example string, fold bool, check func(string) string) map[string]string {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping of names to values such as %s, got %s", example, describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n, path, "empty: leave it out to match any value")
		return nil
	}
	out := map[string]string{}
	lower := map[string]int{}
	d.fields(n, path, nil, func(name string, v *yaml.Node) {
		fpath := path + "." + name
		if msg := check(name); msg != "" {
			d.errorf(v, fpath, "%s", msg)
			return
		}
		if fold {
			if line, dup := lower[strings.ToLower(name)]; dup {
				d.errorf(v, fpath, "header named twice (first at line %d): names are case-insensitive", line)
				return
			}
			lower[strings.ToLower(name)] = v.Line
		}
		if s, ok := d.str(v, fpath); ok {
			out[name] = s
		}
	})
	return out
}

// headerStyle decodes the top-level headers field.
func (d *decoder) headerStyle(v *yaml.Node, cfg *Document) {
	if s, ok := d.str(v, "headers"); ok {
		style, err := headers.ParseStyle(s)
		if err != nil {
			d.errorf(v, "headers", "unknown style %q (want both, legacy, draft or none)", s)
		}
		cfg.HeaderStyle, cfg.headersLine = style, v.Line
	}
}

// unmatched decodes the top-level unmatched field.
func (d *decoder) unmatched(v *yaml.Node, cfg *Document) {
	s, ok := d.str(v, "unmatched")
	if !ok {
		return
	}
	switch s {
	case "allow":
		cfg.Unmatched = middleware.UnmatchedAllow
	case "deny":
		cfg.Unmatched = middleware.UnmatchedDeny
	default:
		d.errorf(v, "unmatched", "unknown policy %q (want allow or deny)", s)
		return
	}
	cfg.UnmatchedSet = true
}

// limitDefaults are the settings of a rule that apply to each of its
// limits (and of its plans' limits) that does not set its own.
type limitDefaults struct {
	algorithm     middleware.Algorithm
	algorithmNode *yaml.Node
	location      *time.Location
	locationNode  *yaml.Node
	usedLocation  bool // some limit took the rule's time zone
}

// limits decodes a list of limits, applying the rule's defaults.
func (d *decoder) limits(n *yaml.Node, path string, defaults *limitDefaults) []middleware.Limit {
	if !d.seq(n, path) {
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n, path, "empty: want at least one {requests: N, window: D}")
		return nil
	}
	var out []middleware.Limit
	windows := map[string]int{}
	for i, ln := range n.Content {
		ln = resolve(ln)
		ipath := path + "[" + strconv.Itoa(i) + "]"
		if ln.Kind != yaml.MappingNode {
			d.errorf(ln, ipath, "want a mapping such as {requests: 100, window: 1m}, got %s", describe(ln))
			continue
		}
		start := d.nerrs
		l := middleware.Limit{Algorithm: defaults.algorithm}
		var reqNode, winNode, algNode, burstNode, tzNode, logNode, delayNode, ceilNode *yaml.Node
		d.fields(ln, ipath, limitFields, func(field string, v *yaml.Node) {
			fpath := ipath + "." + field
			switch field {
			case "requests":
				if r, ok := d.int(v, fpath); ok {
					if r <= 0 {
						d.errorf(v, fpath, "%d must be at least 1", r)
						return
					}
					l.Requests, reqNode = r, v
				}
			case "window":
				if v.Kind == yaml.ScalarNode && strings.HasPrefix(v.Value, "calendar_") {
					p, ok := window.ParsePeriod(v.Value)
					if !ok {
						d.errorf(v, fpath, "unknown calendar period %q: want calendar_day, calendar_week or calendar_month", v.Value)
						return
					}
					l.Period, winNode = middleware.Period(p), v
					return
				}
				if w, ok := d.duration(v, fpath); ok {
					l.Window, winNode = w, v
				}
			case "algorithm":
				if a, ok := d.algorithm(v, fpath); ok {
					l.Algorithm, algNode = a, v
				}
			case "burst":
				if b, ok := d.int(v, fpath); ok {
					if b <= 0 {
						d.errorf(v, fpath, "%d must be at least 1", b)
						return
					}
					l.Burst, burstNode = b, v
				}
			case "max_delay":
				if w, ok := d.duration(v, fpath); ok {
					l.MaxDelay, delayNode = w, v
				}
			case "ban":
				l.Ban = d.ban(v, fpath)
			case "time_zone":
				if loc, ok := d.timeZone(v, fpath); ok {
					l.Location, tzNode = loc, v
				}
			case "max_log":
				if m, ok := d.int(v, fpath); ok {
					if m <= 0 {
						d.errorf(v, fpath, "%d must be at least 1", m)
						return
					}
					l.MaxLog, logNode = m, v
				}
			case "ceiling": // overload.go
				if c, ok := d.ceiling(v, fpath); ok {
					l.Ceiling, ceilNode = c, v
				}
			}
		})
		if reqNode == nil && d.ok(start) {
			d.errorf(ln, ipath+".requests", "required")
		}
		if winNode == nil && d.ok(start) {
			d.errorf(ln, ipath+".window", "required")
		}
		if !d.ok(start) {
			continue
		}
		if l.Period != middleware.NoPeriod {
			// A calendar period implies a fixed window, in the rule's
			// time zone unless the limit has its own.
			if algNode == nil {
				l.Algorithm = middleware.FixedWindow
			}
			if tzNode == nil && defaults.location != nil {
				l.Location = defaults.location
				defaults.usedLocation = true
			}
		}
		if err := l.Validate(); err != nil {
			// Limit.Validate is the one judge of a limit; its error names
			// the field at fault, which points at the line.
			nodes := map[string]*yaml.Node{"requests": reqNode, "window": winNode, "algorithm": algNode,
				"burst": burstNode, "time_zone": tzNode, "max_log": logNode, "max_delay": delayNode}
			var le *window.LimitError
			if errors.As(err, &le) && nodes[le.Field] != nil {
				d.errorf(nodes[le.Field], ipath+"."+le.Field, "%s", le.Msg)
			} else {
				d.errorf(ln, ipath, "%v", err)
			}
			continue
		}
		if !d.checkCeiling(l, ceilNode, ipath) {
			continue
		}
		w := windowName(l)
		if line, dup := windows[w]; dup {
			d.errorf(winNode, ipath+".window", "%s used twice (first at line %d): one limit per window", w, line)
			continue
		}
		windows[w] = winNode.Line
		out = append(out, l)
	}
	return out
}

// windowName is how a file names a limit's window: "1m", "1d",
// "calendar_day"; the rate-limit headers name it the same way.
func windowName(l middleware.Limit) string {
	return window.Limit{Window: l.Window, Period: window.Period(l.Period)}.WindowName()
}

// formatLimit describes a limit as a file would: "100 per 1m",
// "10 per 1s (token_bucket, burst 20)".
func formatLimit(l middleware.Limit) string {
	s := fmt.Sprintf("%d per %s", l.Requests, windowName(l))
	switch {
	case (l.Algorithm == middleware.TokenBucket || l.Algorithm == middleware.LeakyBucket) && l.Burst > 0:
		s += fmt.Sprintf(" (%s, burst %d)", l.Algorithm, l.Burst)
	case l.Algorithm != middleware.SlidingWindow:
		s += " (" + l.Algorithm.String() + ")"
	}
	return s
}

// algorithm decodes an algorithm's name.
func (d *decoder) algorithm(n *yaml.Node, path string) (middleware.Algorithm, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return 0, false
	}
	a, err := window.ParseAlgorithm(s)
	if err != nil {
		d.errorf(n, path, "%v", err)
		return 0, false
	}
	return middleware.Algorithm(a), true
}

// timeZone decodes an IANA time zone name such as "Europe/Paris".
func (d *decoder) timeZone(n *yaml.Node, path string) (*time.Location, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return nil, false
	}
	if s == "" || s == "Local" {
		d.errorf(n, path, "want an IANA time zone name such as UTC or Europe/Paris, got %q", s)
		return nil, false
	}
	loc, err := time.LoadLocation(s)
	if err != nil {
		d.errorf(n, path, "unknown time zone %q (want an IANA name such as Europe/Paris)", s)
		return nil, false
	}
	return loc, true
}

// plans decodes a rule's plans.
func (d *decoder) plans(n *yaml.Node, path string, defaults *limitDefaults) map[string][]middleware.Limit {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping of plan names to limits, got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n, path, "empty: leave plans out when the rule has none")
		return nil
	}
	plans := map[string][]middleware.Limit{}
	d.fields(n, path, nil, func(name string, v *yaml.Node) {
		fpath := path + "." + name
		if !rulename.Valid(name) {
			d.errorf(v, fpath, "bad plan name %q: want 1 to 64 of A-Z a-z 0-9 _ . -", name)
			return
		}
		if l := d.limits(v, fpath, defaults); l != nil {
			plans[name] = l
		}
	})
	return plans
}

// allowList is a decoded allow field.
type allowList struct {
	cidrs     []netip.Prefix
	keys      []string
	cidrsNode *yaml.Node
}

// allow decodes an allow field.
func (d *decoder) allow(n *yaml.Node, path string) allowList {
	var a allowList
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {cidrs: [203.0.113.0/24], keys: [\"user:ops\"]}, got %s", describe(n))
		return a
	}
	d.fields(n, path, allowFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		if !d.seq(v, fpath) {
			return
		}
		for i, item := range v.Content {
			item = resolve(item)
			ipath := fpath + "[" + strconv.Itoa(i) + "]"
			s, ok := d.str(item, ipath)
			if !ok {
				continue
			}
			switch field {
			case "cidrs":
				p, err := parseCIDR(s)
				if err != "" {
					d.errorf(item, ipath, "%s", err)
					continue
				}
				a.cidrs, a.cidrsNode = append(a.cidrs, p), v
			case "keys":
				if s == "" {
					d.errorf(item, ipath, "empty key")
					continue
				}
				a.keys = append(a.keys, s)
			}
		}
	})
	return a
}

// parseCIDR parses an allowlisted network: a prefix in canonical form or a
// single address.
func parseCIDR(s string) (netip.Prefix, string) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Sprintf("bad CIDR %q", s)
		}
		if m := p.Masked(); m != p {
			return p, fmt.Sprintf("CIDR %q has host bits set: write %s, or %s/%d for the one address", s, m, p.Addr(), p.Addr().BitLen())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return p, fmt.Sprintf("bad CIDR %q: want a network such as 203.0.113.0/24 or an address", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return p, fmt.Sprintf("CIDR %q is IPv4-mapped: clients are keyed by their IPv4 address, so write the IPv4 network", s)
	}
	return p, ""
}

// fields walks the mapping n, calling fn with each key and (alias-resolved)
// value. It reports unknown fields, duplicate keys and keys that are not
// strings. A nil known accepts every key.
func (d *decoder) fields(n *yaml.Node, path string, known []string, fn func(key string, v *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
			d.errorf(k, path, "key %s is not a name", describe(k))
			continue
		}
		fpath := k.Value
		if path != "" {
			fpath = path + "." + k.Value
		}
		if k.ShortTag() == "!!merge" {
			d.errorf(k, fpath, "merge keys are not supported")
			continue
		}
		if line, dup := seen[k.Value]; dup {
			d.errorf(k, fpath, "defined twice (first at line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		if known != nil && !slices.Contains(known, k.Value) {
			d.errorf(k, fpath, "unknown field (want %s)", strings.Join(known, ", "))
			continue
		}
		fn(k.Value, v)
	}
}

// seq reports whether n is a sequence, recording an error if it is not.
func (d *decoder) seq(n *yaml.Node, path string) bool {
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, path, "want a list, got %s", describe(n))
		return false
	}
	return true
}

// str decodes a string. Plain numbers and booleans are taken as written.
func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" || n.ShortTag() == "!!binary" {
		d.errorf(n, path, "want a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// int decodes an integer.
func (d *decoder) int(n *yaml.Node, path string) (int, bool) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil {
		d.errorf(n, path, "want an integer, got %s", describe(n))
		return 0, false
	}
	if int64(int(v)) != v {
		d.errorf(n, path, "%s is too large", n.Value)
		return 0, false
	}
	return int(v), true
}

// float decodes a number.
func (d *decoder) float(n *yaml.Node, path string) (float64, bool) {
	var v float64
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") || n.Decode(&v) != nil {
		d.errorf(n, path, "want a number, got %s", describe(n))
		return 0, false
	}
	return v, true
}

// bool decodes true or false.
func (d *decoder) bool(n *yaml.Node, path string) (bool, bool) {
	var v bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		d.errorf(n, path, "want true or false, got %s", describe(n))
		return false, false
	}
	return v, true
}

// duration decodes a window: a Go duration or a whole number of days or
// weeks, positive and a whole number of milliseconds.
func (d *decoder) duration(n *yaml.Node, path string) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
			d.errorf(n, path, "bad duration %s: want a unit, as in %ss", n.Value, n.Value)
		} else {
			d.errorf(n, path, "want a duration such as 1m, got %s", describe(n))
		}
		return 0, false
	}
	w, err := parseDuration(n.Value)
	if err != "" {
		d.errorf(n, path, "%s", err)
		return 0, false
	}
	return w, true
}

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// parseDuration parses a window: "3d" and "2w" for whole days and weeks
// (a Go duration has no unit beyond hours), anything else as a Go duration.
func parseDuration(s string) (time.Duration, string) {
	var w time.Duration
	if n, unit, ok := wholeUnits(s); ok {
		if n > int64(1<<63-1)/int64(unit) {
			return 0, fmt.Sprintf("bad duration %q: too long", s)
		}
		w = time.Duration(n) * unit
	} else {
		var err error
		if w, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Sprintf("bad duration %q", s)
		}
	}
	switch {
	case w <= 0:
		return 0, fmt.Sprintf("duration %q must be positive", s)
	case w%time.Millisecond != 0:
		return 0, fmt.Sprintf("duration %q is not a whole number of milliseconds", s)
	}
	return w, ""
}

// wholeUnits parses s as a whole number of days ("3d") or weeks ("2w").
// Numbers too large for an int64 give a count that is too long.
func wholeUnits(s string) (n int64, unit time.Duration, ok bool) {
	if len(s) < 2 {
		return 0, 0, false
	}
	switch s[len(s)-1] {
	case 'd':
		unit = day
	case 'w':
		unit = week
	default:
		return 0, 0, false
	}
	digits := s[:len(s)-1]
	if strings.Trim(digits, "0123456789") != "" {
		return 0, 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		n = 1<<63 - 1
	}
	return n, unit, true
}

// describe names what a node is, for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!str":
			return strconv.Quote(truncate(n.Value))
		case "!!bool":
			return "boolean " + n.Value
		case "!!int", "!!float":
			return "number " + truncate(n.Value)
		}
		return "a " + truncate(n.ShortTag()) + " value"
	}
	return "an unexpected YAML node"
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "..."
}

// resolve returns the node an alias refers to, or n itself.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// checkSize reports whether the tree at n, with aliases expanded, is too
// large or recursive, or "".
func checkSize(n *yaml.Node) string {
	memo := map[*yaml.Node]int{}
	active := map[*yaml.Node]bool{}
	var size func(*yaml.Node) (int, string)
	size = func(n *yaml.Node) (int, string) {
		if n.Kind == yaml.AliasNode {
			if n.Alias == nil {
				return 0, "alias to nothing"
			}
			n = n.Alias
		}
		if s, ok := memo[n]; ok {
			return s, ""
		}
		if active[n] {
			return 0, "an alias refers to a node that contains it"
		}
		active[n] = true
		total := 1
		for _, c := range n.Content {
			s, err := size(c)
			if err != "" {
				return 0, err
			}
			if total += s; total > maxNodes {
				return 0, fmt.Sprintf("more than %d values once aliases are expanded", maxNodes)
			}
		}
		delete(active, n)
		memo[n] = total
		return total, ""
	}
	_, err := size(n)
	return err
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
