package config

import (
	"context"
	"regexp"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/middleware"
)

// usageFields are the fields of a rule's usage mapping.
var usageFields = []string{"unit", "limits", "algorithm", "time_zone", "estimate", "max", "header"}

var unitRE = regexp.MustCompile(`^[a-z0-9_]{1,32}$`)

// usage decodes a rule's usage: limits on what its requests use, in a unit
// settled once each has run (see middleware.Usage).
//
//	usage:
//	  unit: tokens
//	  limits:
//	    - {requests: 10000, window: 1m}
//	  estimate: 200
//	  max: 4000
//	  header: X-Usage-Tokens
//
// requests, in a usage limit, counts units. The rule's own algorithm and
// time_zone do not apply to its usage limits; the usage mapping has its
// own.
func (d *decoder) usage(n *yaml.Node, path string) *middleware.Usage {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {unit: tokens, limits: [{requests: 10000, window: 1m}]}, got %s", describe(n))
		return nil
	}
	start := d.nerrs
	u := &middleware.Usage{}
	var limitsNode, unitNode *yaml.Node
	var defaults limitDefaults
	d.fields(n, path, usageFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		switch field {
		case "unit":
			s, ok := d.str(v, fpath)
			if !ok {
				return
			}
			if !unitRE.MatchString(s) {
				d.errorf(v, fpath, "bad unit %q: want 1 to 32 of a-z 0-9 _, such as tokens", s)
				return
			}
			u.Unit, unitNode = s, v
		case "limits":
			limitsNode = v
		case "algorithm":
			if a, ok := d.algorithm(v, fpath); ok {
				if a == middleware.LeakyBucket {
					d.errorf(v, fpath, "leaky_bucket queues requests and cannot settle usage: want sliding_window, fixed_window, token_bucket or sliding_log")
					return
				}
				defaults.algorithm, defaults.algorithmNode = a, v
			}
		case "time_zone":
			if loc, ok := d.timeZone(v, fpath); ok {
				defaults.location, defaults.locationNode = loc, v
			}
		case "estimate", "max":
			c, ok := d.int(v, fpath)
			if !ok {
				return
			}
			if c < 1 {
				d.errorf(v, fpath, "%d must be at least 1", c)
				return
			}
			if field == "estimate" {
				u.Estimate = c
			} else {
				u.Max = c
			}
		case "header":
			s, ok := d.str(v, fpath)
			if !ok {
				return
			}
			if !httptoken.Valid(s) {
				d.errorf(v, fpath, "bad header name %q", s)
				return
			}
			u.Header = s
		}
	})
	if unitNode == nil && d.ok(start) {
		d.errorf(n, path+".unit", "required, such as tokens")
	}
	if limitsNode == nil {
		if d.ok(start) {
			d.errorf(n, path+".limits", "required: the limits on the units used, such as [{requests: 10000, window: 1m}]")
		}
		return nil
	}
	u.Limits = d.limits(limitsNode, path+".limits", &defaults)
	if !d.ok(start) {
		return nil
	}
	for i, l := range u.Limits { // all decoded: their nodes are limitsNode's
		if l.Algorithm == middleware.LeakyBucket {
			d.errorf(resolve(limitsNode).Content[i], path+".limits["+strconv.Itoa(i)+"]", "leaky_bucket queues requests and cannot settle usage: want sliding_window, fixed_window, token_bucket or sliding_log")
		}
		if l.Ceiling != 0 {
			d.errorf(resolve(limitsNode).Content[i], path+".limits["+strconv.Itoa(i)+"].ceiling", "a usage limit cannot be elastic")
		}
		if l.Ban != 0 {
			d.errorf(resolve(limitsNode).Content[i], path+".limits["+strconv.Itoa(i)+"].ban", "a usage limit cannot ban; put the ban on the rule's limits")
		}
	}
	if defaults.locationNode != nil && !defaults.usedLocation && d.ok(start) {
		d.errorf(defaults.locationNode, path+".time_zone", "no usage limit has a calendar window (calendar_day, calendar_week or calendar_month)")
	}
	if !d.ok(start) {
		return nil
	}
	return u
}

// Settle makes nopStore a middleware.Settler, so that rules with usage
// limits can be checked too.
func (nopStore) Settle(context.Context, time.Time, []middleware.Charge, []middleware.Decision) error {
	return nil
}
