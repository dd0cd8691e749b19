package config

import (
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/window"
	"github.com/sluicehq/sluice/middleware"
)

// The keys of elastic limits, adaptive concurrency and priorities:
//
//	limits: [{requests: 100, window: 1m, ceiling: 300}]
//	adaptive_concurrency: {min: 4, max: 200, status: 503}
//	priority: critical
var adaptiveFields = []string{"min", "max", "status"}

// adaptiveConcurrency decodes a rule's adaptive_concurrency.
func (d *decoder) adaptiveConcurrency(n *yaml.Node, path string) *middleware.AdaptiveConcurrency {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {min: 4, max: 200}, got %s", describe(n))
		return nil
	}
	start := d.nerrs
	a := &middleware.AdaptiveConcurrency{}
	var minNode, maxNode *yaml.Node
	d.fields(n, path, adaptiveFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		c, ok := d.int(v, fpath)
		if !ok {
			return
		}
		switch field {
		case "min":
			if c < 1 {
				d.errorf(v, fpath, "%d must be at least 1", c)
				return
			}
			a.Min, minNode = c, v
		case "max":
			if c < 1 || c > 1_000_000 {
				d.errorf(v, fpath, "%d must be between 1 and 1000000", c)
				return
			}
			a.Max, maxNode = c, v
		case "status":
			if c != 429 && c != 503 {
				d.errorf(v, fpath, "%d: want 503 or 429", c)
				return
			}
			a.Status = c
		}
	})
	if minNode == nil && d.ok(start) {
		d.errorf(n, path+".min", "required")
	}
	if maxNode == nil && d.ok(start) {
		d.errorf(n, path+".max", "required")
	}
	if d.ok(start) && a.Max < a.Min {
		d.errorf(maxNode, path+".max", "%d is below min %d", a.Max, a.Min)
	}
	if !d.ok(start) {
		return nil
	}
	return a
}

// priority decodes a rule's priority.
func (d *decoder) priority(n *yaml.Node, path string) (middleware.Priority, bool) {
	s, ok := d.str(n, path)
	if !ok {
		return 0, false
	}
	p, err := middleware.ParsePriority(s)
	if err != nil {
		d.errorf(n, path, "unknown priority %q: want sheddable, normal, high or critical", s)
		return 0, false
	}
	return p, true
}

// ceiling decodes a limit's ceiling.
func (d *decoder) ceiling(n *yaml.Node, path string) (int, bool) {
	c, ok := d.int(n, path)
	if !ok {
		return 0, false
	}
	if c < 1 || c > window.MaxRequests {
		d.errorf(n, path, "%d must be between 1 and 2^50", c)
		return 0, false
	}
	return c, true
}

// checkCeiling checks the ceiling of a decoded limit against the rest of
// it; it reports whether the limit is valid.
func (d *decoder) checkCeiling(l middleware.Limit, ceilNode *yaml.Node, path string) bool {
	if ceilNode == nil {
		return true
	}
	switch {
	case l.Ceiling <= l.Requests:
		d.errorf(ceilNode, path+".ceiling", "%d must be above requests (%d)", l.Ceiling, l.Requests)
	case l.Algorithm == middleware.TokenBucket || l.Algorithm == middleware.LeakyBucket:
		d.errorf(ceilNode, path+".ceiling", "applies only to the sliding_window, fixed_window and sliding_log algorithms, not to %s", l.Algorithm)
	default:
		return true
	}
	return false
}

// checkOverload checks what spans the fields of a rule with elastic
// limits, adaptive concurrency or a priority.
func (d *decoder) checkOverload(r *middleware.Rule, overageNode *yaml.Node, path string) {
	if overageNode == nil {
		return
	}
	for _, l := range r.Limits {
		if l.Ceiling > 0 {
			d.errorf(overageNode, path+".overage", "a rule whose limits have a ceiling has no overage")
			return
		}
	}
}

// overloadOnly reports whether a rule has only adaptive concurrency or a
// priority, and so needs no key and no limits.
func overloadOnly(r *middleware.Rule, limitsNode, concNode, plansNode *yaml.Node) bool {
	return (r.AdaptiveConcurrency != nil || r.Priority != middleware.PriorityUnset) && limitsNode == nil && concNode == nil && plansNode == nil
}
