package config

import (
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/middleware"
)

// scopeFields is a rule's scope key, read by scopeField and checked by
// checkScope once the rule's limits are known.
type scopeFields struct {
	scope middleware.Scope
	node  *yaml.Node
}

// scopeField decodes the scope key of a rule: region, global or
// global_strict.
func (d *decoder) scopeField(sc *scopeFields, v *yaml.Node, path string) {
	s, ok := d.str(v, path)
	if !ok {
		return
	}
	sc.scope, sc.node = middleware.ScopeRegion, v
	m, err := middleware.ParseScope(s)
	if err != nil {
		d.errorf(v, path, "%v", err)
		return
	}
	sc.scope = m
}

// checkScope checks a rule's scope against its sync mode and the
// algorithms of its limits and plans, and sets it on r. A global rule
// takes sync_interval (its sync across regions).
func (d *decoder) checkScope(sc *scopeFields, sf *syncFields, r *middleware.Rule, limits []middleware.Limit, plans map[string][]middleware.Limit, path string) {
	r.Scope = sc.scope
	if sc.scope != middleware.ScopeGlobal {
		return
	}
	sf.global = true
	if sf.mode != middleware.SyncExact {
		d.errorf(sf.modeNode, path+".sync", "%s does not apply to a rule with scope: global (it syncs across regions at sync_interval)", sf.mode)
	}
	check := func(ls []middleware.Limit, field string) {
		for i, l := range ls {
			switch {
			case l.Algorithm != middleware.SlidingWindow && l.Algorithm != middleware.FixedWindow:
				d.errorf(sc.node, path+".scope", "global: %s[%d] is a %s (scope: global takes sliding_window and fixed_window; use global_strict)", field, i, l.Algorithm)
			case l.Period != 0:
				d.errorf(sc.node, path+".scope", "global: %s[%d] has a calendar window (scope: global takes fixed lengths; use global_strict)", field, i)
			}
		}
	}
	check(limits, "limits")
	for _, name := range sortedKeys(plans) {
		check(plans[name], "plans."+name)
	}
	if len(limits) == 0 && len(plans) == 0 {
		d.errorf(sc.node, path+".scope", "global: the rule has only a concurrency limit, which is always the region's")
	}
}
