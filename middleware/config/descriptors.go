package config

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/rulename"
	"github.com/sluicehq/sluice/internal/window"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// The fields of the mappings of an Envoy/Lyft-style descriptor file.
var (
	descRootFields  = []string{"domain", "descriptors", "headers", "unmatched"}
	descFields      = []string{"key", "value", "rate_limit", "shadow_mode", "usage", "detailed_metric", "descriptors"}
	rateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"}
)

// units are the rate_limit units of a descriptor file.
var units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    day,
}

// maxDescriptorDepth bounds the nesting of descriptors.
const maxDescriptorDepth = 16

// isDescriptorFile reports whether the top-level mapping n is an
// Envoy/Lyft-style descriptor file: whether it has a domain field.
func isDescriptorFile(n *yaml.Node) bool {
	if n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.Kind == yaml.ScalarNode && k.Value == "domain" {
			return true
		}
	}
	return false
}

// descStep is one level of a descriptor: which requests it selects.
type descStep struct {
	attr   *attribute
	key    string // the descriptor key
	name   string // the rule-name part: key or key_value
	kind   int    // stepAny, stepExact or stepPrefix
	value  string // the exact value or the wildcard's prefix
	exact  map[string]bool
	prefix []string // the prefixes of the wildcard siblings of the same key
}

const (
	stepAny = iota
	stepExact
	stepPrefix
)

// matches reports whether r has this level's attribute with a value this
// level selects: an exact value, then a wildcard, then the key alone, as
// the Envoy ratelimit service tries them.
func (s *descStep) matches(r keyfunc.Request) bool {
	v, ok := s.attr.value(r)
	return ok && s.matchesValue(v)
}

// matchesValue reports whether this level selects the value v.
func (s *descStep) matchesValue(v string) bool {
	if v == "" {
		return false
	}
	switch s.kind {
	case stepExact:
		return v == s.value
	case stepPrefix:
		return strings.HasPrefix(v, s.value) && !s.exact[v]
	}
	if s.exact[v] {
		return false
	}
	for _, p := range s.prefix {
		if strings.HasPrefix(v, p) {
			return false
		}
	}
	return true
}

// descNode is one decoded entry of a descriptors list.
type descNode struct {
	n, keyNode, valueNode *yaml.Node
	rateLimit, children   *yaml.Node
	path, key, value      string
	hasValue, shadow      bool
	usage                 bool // usage: true, see DescriptorMatch.Usage
	attr                  *attribute
}

// descBuild collects the rules of a descriptor file as they are decoded.
type descBuild struct {
	domain   string
	rules    []middleware.Rule
	names    map[string]bool
	named    map[string]int       // rate_limit.name -> index in rules
	replaces map[int][]*yaml.Node // index -> its replaces names' nodes
	matches  []func(keyfunc.Request) bool
	attrs    map[string]*attribute // by descriptor key
	usage    bool                  // a descriptor has usage: true
}

// descriptorRoot decodes an Envoy/Lyft-style descriptor file into cfg.
func (d *decoder) descriptorRoot(n *yaml.Node, cfg *Document) {
	var list *yaml.Node
	b := &descBuild{names: map[string]bool{}, named: map[string]int{}, replaces: map[int][]*yaml.Node{}, attrs: map[string]*attribute{}}
	d.fields(n, "", descRootFields, func(key string, v *yaml.Node) {
		switch key {
		case "domain":
			if s, ok := d.str(v, "domain"); ok {
				if s == "" {
					d.errorf(v, "domain", "empty")
					return
				}
				b.domain = s
			}
		case "descriptors":
			list = v
		case "headers":
			d.headerStyle(v, cfg)
		case "unmatched":
			d.unmatched(v, cfg)
		}
	})
	if list == nil {
		d.errorf(n, "descriptors", "required")
		return
	}
	if b.domain == "" {
		return
	}
	cfg.Domain = b.domain
	start := d.nerrs
	d.descriptors(list, "descriptors", nil, b)
	if !d.ok(start) {
		return
	}
	d.applyReplaces(b)
	if len(b.rules) == 0 {
		d.errorf(list, "descriptors", "no descriptor sets a rate_limit")
		return
	}
	cfg.Rules, cfg.Usage = b.rules, b.usage
}

// descriptors decodes a list of descriptors below the levels parent.
func (d *decoder) descriptors(list *yaml.Node, lpath string, parent []*descStep, b *descBuild) {
	if !d.seq(list, lpath) {
		return
	}
	if len(list.Content) == 0 {
		d.errorf(list, lpath, "empty: want at least one {key: ..., rate_limit: ...}")
		return
	}
	if len(parent) >= maxDescriptorDepth {
		d.errorf(list, lpath, "descriptors nested more than %d deep", maxDescriptorDepth)
		return
	}
	var nodes []*descNode
	seen := map[[2]string]int{}
	for i, en := range list.Content {
		dn := d.descriptor(resolve(en), lpath+"["+strconv.Itoa(i)+"]", b)
		if dn == nil {
			continue
		}
		id := [2]string{dn.key, "\x00"}
		if dn.hasValue {
			id[1] = dn.value
		}
		if line, dup := seen[id]; dup {
			what := "key " + strconv.Quote(dn.key)
			if dn.hasValue {
				what += " with value " + strconv.Quote(dn.value)
			} else {
				what += " without a value"
			}
			d.errorf(dn.keyNode, dn.path+".key", "%s defined twice at this level (first at line %d)", what, line)
			continue
		}
		seen[id] = dn.keyNode.Line
		nodes = append(nodes, dn)
	}
	// The siblings of each key: exact values and wildcard prefixes, which
	// take precedence over the key alone.
	exact := map[string]map[string]bool{}
	prefixes := map[string][]string{}
	for _, dn := range nodes {
		switch {
		case !dn.hasValue:
		case strings.HasSuffix(dn.value, "*"):
			prefixes[dn.key] = append(prefixes[dn.key], strings.TrimSuffix(dn.value, "*"))
		default:
			if exact[dn.key] == nil {
				exact[dn.key] = map[string]bool{}
			}
			exact[dn.key][dn.value] = true
		}
	}
	for _, dn := range nodes {
		st := &descStep{attr: dn.attr, key: dn.key, name: dn.key, exact: exact[dn.key]}
		switch {
		case !dn.hasValue:
			st.prefix = prefixes[dn.key]
		case strings.HasSuffix(dn.value, "*"):
			st.kind, st.value = stepPrefix, strings.TrimSuffix(dn.value, "*")
			st.name += "_" + st.value
		default:
			st.kind, st.value = stepExact, dn.value
			st.name += "_" + dn.value
		}
		steps := append(slices.Clone(parent), st)
		if dn.rateLimit != nil || dn.children == nil {
			// A descriptor with neither a rate_limit nor descriptors is
			// allowlisted, as in Envoy: it applies, without a limit.
			d.descriptorRule(dn, steps, b)
		}
		if dn.children != nil {
			d.descriptors(dn.children, dn.path+".descriptors", steps, b)
		}
	}
}

// descriptor decodes one entry of a descriptors list, or returns nil.
func (d *decoder) descriptor(n *yaml.Node, p string, b *descBuild) *descNode {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, p, "want a mapping such as {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}, got %s", describe(n))
		return nil
	}
	start := d.nerrs
	dn := &descNode{n: n, path: p}
	d.fields(n, p, descFields, func(field string, v *yaml.Node) {
		fpath := p + "." + field
		switch field {
		case "key":
			if s, ok := d.str(v, fpath); ok {
				if s == "" {
					d.errorf(v, fpath, "empty")
					return
				}
				dn.key, dn.keyNode = s, v
			}
		case "value":
			if s, ok := d.str(v, fpath); ok {
				if s == "" || s == "*" {
					d.errorf(v, fpath, "%q: leave value out to count each value apart", s)
					return
				}
				dn.value, dn.valueNode, dn.hasValue = s, v, true
			}
		case "rate_limit":
			dn.rateLimit = v
		case "shadow_mode":
			dn.shadow, _ = d.bool(v, fpath)
		case "usage":
			dn.usage, _ = d.bool(v, fpath)
		case "detailed_metric":
			d.bool(v, fpath) // accepted for compatibility; metrics are per rule
		case "descriptors":
			dn.children = v
		}
	})
	if dn.keyNode == nil {
		if d.ok(start) {
			d.errorf(n, p+".key", "required")
		}
		return nil
	}
	attr, err := d.attribute(dn.key, b)
	if err != nil {
		d.errorf(dn.keyNode, p+".key", "%v", err)
		return nil
	}
	dn.attr = attr
	if dn.hasValue && attr.canon != nil && !strings.HasSuffix(dn.value, "*") {
		v, err := attr.canon(dn.value)
		if err != nil {
			d.errorf(dn.valueNode, p+".value", "%v", err)
			return nil
		}
		dn.value = v
	}
	if !d.ok(start) {
		return nil
	}
	return dn
}

// descriptorRule adds the rule of the descriptor dn, whose levels (its
// own last) are steps.
func (d *decoder) descriptorRule(dn *descNode, steps []*descStep, b *descBuild) {
	start := d.nerrs
	var name string
	var nameNode *yaml.Node
	var replaces []*yaml.Node
	unlimited, unitSet, reqSet := dn.rateLimit == nil, false, false
	var unit time.Duration
	var requests int
	var unitNode, reqNode *yaml.Node
	if rl := dn.rateLimit; rl != nil {
		rpath := dn.path + ".rate_limit"
		if rl.Kind != yaml.MappingNode {
			d.errorf(rl, rpath, "want a mapping such as {unit: second, requests_per_unit: 10}, got %s", describe(rl))
			return
		}
		d.fields(rl, rpath, rateLimitFields, func(field string, v *yaml.Node) {
			fpath := rpath + "." + field
			switch field {
			case "unit":
				s, ok := d.str(v, fpath)
				if !ok {
					return
				}
				u, ok := units[strings.ToLower(s)]
				if !ok {
					d.errorf(v, fpath, "unknown unit %q (want second, minute, hour or day)", s)
					return
				}
				unit, unitSet, unitNode = u, true, v
			case "requests_per_unit":
				if r, ok := d.int(v, fpath); ok {
					switch {
					case r < 0:
						d.errorf(v, fpath, "%d must not be negative", r)
					case r > window.MaxRequests:
						d.errorf(v, fpath, "%d is too large: requests must not exceed 2^50 (%d)", r, window.MaxRequests)
					default:
						requests, reqSet, reqNode = r, true, v
					}
				}
			case "unlimited":
				if u, ok := d.bool(v, fpath); ok {
					unlimited = u
				}
			case "name":
				if s, ok := d.str(v, fpath); ok {
					if !rulename.Valid(s) {
						d.errorf(v, fpath, "bad name %q: want 1 to 64 of A-Z a-z 0-9 _ . -", s)
						return
					}
					name, nameNode = s, v
				}
			case "replaces":
				if !d.seq(v, fpath) {
					return
				}
				for i, item := range v.Content {
					item = resolve(item)
					ipath := fpath + "[" + strconv.Itoa(i) + "]"
					if item.Kind != yaml.MappingNode {
						d.errorf(item, ipath, "want a mapping such as {name: specific_limit}, got %s", describe(item))
						continue
					}
					d.fields(item, ipath, []string{"name"}, func(_ string, nv *yaml.Node) {
						if _, ok := d.str(nv, ipath+".name"); ok {
							replaces = append(replaces, nv)
						}
					})
				}
			}
		})
		if !d.ok(start) {
			return
		}
		switch {
		case unlimited && (unitSet || reqSet):
			at := unitNode
			if at == nil {
				at = reqNode
			}
			d.errorf(at, rpath, "unlimited: true takes no unit or requests_per_unit")
		case !unlimited && !unitSet:
			d.errorf(rl, rpath+".unit", "required (second, minute, hour or day), unless unlimited: true")
		case !unlimited && !reqSet:
			d.errorf(rl, rpath+".requests_per_unit", "required, unless unlimited: true")
		}
		if !d.ok(start) {
			return
		}
	}
	if dn.usage {
		switch {
		case !d.env.RateLimitService:
			d.errorf(dn.n, dn.path+".usage", "applies to the rate limit service only (Env.RateLimitService), whose calls report usage")
		case unlimited || requests == 0:
			d.errorf(dn.n, dn.path+".usage", "needs a rate_limit with requests_per_unit, the budget the usage is charged to")
		}
		if !d.ok(start) {
			return
		}
	}
	if nameNode != nil {
		if b.names[name] {
			d.errorf(nameNode, dn.path+".rate_limit.name", "%q used twice", name)
			return
		}
	} else {
		name = b.ruleName(steps)
	}
	b.names[name] = true
	match := func(r keyfunc.Request) bool {
		for _, s := range steps {
			if !s.matches(r) {
				return false
			}
		}
		return true
	}
	var keys []keyfunc.Func
	for _, s := range steps {
		if s.kind != stepExact && s.attr.key != nil { // none for a rate limit service
			keys = append(keys, s.attr.key)
		}
	}
	key := keyfunc.Global()
	switch len(keys) {
	case 0:
	case 1:
		key = keys[0]
	default:
		key = keyfunc.Join(keys...)
	}
	r := middleware.Rule{Name: name, Key: key, Match: match, Shadow: dn.shadow}
	if d.env.RateLimitService {
		m := DescriptorMatch{Rule: name, Limit: middleware.Limit{Requests: requests, Window: unit, Algorithm: middleware.FixedWindow},
			Unlimited: dn.rateLimit != nil && unlimited, Shadow: dn.shadow, Usage: dn.usage}
		b.usage = b.usage || dn.usage
		if unlimited {
			m.Limit = middleware.Limit{}
		}
		serviceRule(&r, steps, m)
		match = r.Match
	}
	switch {
	case unlimited:
		r.LimitsFunc = func(keyfunc.Request, string) []middleware.Limit { return nil }
	case requests == 0:
		r.Deny = true
	default:
		r.Limits = []middleware.Limit{{Requests: requests, Window: unit, Algorithm: middleware.FixedWindow}}
	}
	if nameNode != nil {
		b.named[name] = len(b.rules)
	}
	if len(replaces) > 0 {
		b.replaces[len(b.rules)] = replaces
	}
	b.rules = append(b.rules, r)
	b.matches = append(b.matches, match)
}

// applyReplaces makes each rule named in a replaces list give way to the
// rules that replace it: it no longer applies to a request they apply to.
func (d *decoder) applyReplaces(b *descBuild) {
	by := map[int][]func(keyfunc.Request) bool{}
	for i := range b.rules {
		for _, nv := range b.replaces[i] {
			j, ok := b.named[nv.Value]
			if !ok {
				d.errorf(nv, "replaces", "no rate_limit is named %q", nv.Value)
				continue
			}
			if j == i {
				d.errorf(nv, "replaces", "%q replaces itself", nv.Value)
				continue
			}
			by[j] = append(by[j], b.matches[i])
		}
	}
	for j, replacers := range by {
		own := b.matches[j]
		if d.env.RateLimitService {
			b.rules[j].Match = replacedInService(own, replacers)
			continue
		}
		b.rules[j].Match = func(r keyfunc.Request) bool {
			if !own(r) {
				return false
			}
			for _, m := range replacers {
				if m(r) {
					return false
				}
			}
			return true
		}
	}
}

// ruleName names the rule of a descriptor as the Envoy ratelimit service
// names its limits, domain.key_value.key, made a valid and unique rule
// name.
func (b *descBuild) ruleName(steps []*descStep) string {
	parts := []string{b.domain}
	for _, s := range steps {
		parts = append(parts, s.name)
	}
	full := strings.Join(parts, ".")
	name := []byte(full)
	for i, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			name[i] = '_'
		}
	}
	s := string(name)
	if len(s) > 64 || s != full {
		sum := sha256.Sum256([]byte(full))
		s = s[:min(len(s), 51)] + "-" + hex.EncodeToString(sum[:6])
	}
	for i := 2; b.names[s]; i++ {
		suffix := "-" + strconv.Itoa(i)
		s = s[:min(len(s), 64-len(suffix))] + suffix
	}
	return s
}
