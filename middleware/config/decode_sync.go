package config

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/middleware"
)

// syncFields are a rule's coordination keys, read by syncField and
// checked by checkSync once the rule's limits are known.
type syncFields struct {
	mode                                       middleware.SyncMode
	modeNode, leaseNode, intervalNode, maxNode *yaml.Node
	lease, maxUnsynced                         int
	interval                                   time.Duration
	// global: the rule has scope: global, whose sync_interval is its
	// sync across regions (decode_scope.go).
	global bool
}

// syncField decodes one of the keys sync, lease, sync_interval and
// max_unsynced of a rule.
func (d *decoder) syncField(sf *syncFields, field string, v *yaml.Node, path string) {
	switch field {
	case "sync":
		s, ok := d.str(v, path)
		if !ok {
			return
		}
		m, err := middleware.ParseSyncMode(s)
		if err != nil {
			d.errorf(v, path, "%v", err)
			return
		}
		sf.mode, sf.modeNode = m, v
	case "lease", "max_unsynced":
		n, ok := d.int(v, path)
		if !ok {
			return
		}
		if n < 1 || n > 1<<30 {
			d.errorf(v, path, "%d must be between 1 and 2^30", n)
			return
		}
		if field == "lease" {
			sf.lease, sf.leaseNode = n, v
		} else {
			sf.maxUnsynced, sf.maxNode = n, v
		}
	case "sync_interval":
		w, ok := d.duration(v, path)
		if !ok {
			return
		}
		if w > time.Hour {
			d.errorf(v, path, "%s is longer than 1h", w)
			return
		}
		sf.interval, sf.intervalNode = w, v
	}
}

// checkSync checks a rule's coordination keys against each other and
// against the algorithms of its limits and plans, and sets them on r.
func (d *decoder) checkSync(sf *syncFields, r *middleware.Rule, limits []middleware.Limit, plans map[string][]middleware.Limit, path string) {
	needs := func(n *yaml.Node, field string, modes ...middleware.SyncMode) {
		if n == nil {
			return
		}
		for _, m := range modes {
			if sf.mode == m {
				return
			}
		}
		want := "sync: " + modes[0].String()
		if len(modes) > 1 {
			want += " or sync: " + modes[1].String()
		}
		d.errorf(n, path+"."+field, "applies only to a rule with %s", want)
	}
	needs(sf.leaseNode, "lease", middleware.SyncLease)
	needs(sf.maxNode, "max_unsynced", middleware.SyncWriteBack)
	if !sf.global {
		needs(sf.intervalNode, "sync_interval", middleware.SyncLease, middleware.SyncWriteBack)
	}
	if sf.mode != middleware.SyncExact {
		check := func(ls []middleware.Limit, field string) {
			for i, l := range ls {
				switch l.Algorithm {
				case middleware.SlidingWindow, middleware.FixedWindow, middleware.TokenBucket:
				default:
					d.errorf(sf.modeNode, path+".sync", "%s: %s[%d] is a %s, which is always decided exactly (sync: lease and write_back take sliding_window, fixed_window and token_bucket)", sf.mode, field, i, l.Algorithm)
				}
			}
		}
		check(limits, "limits")
		for _, name := range sortedKeys(plans) {
			check(plans[name], "plans."+name)
		}
		if len(limits) == 0 && len(plans) == 0 {
			d.errorf(sf.modeNode, path+".sync", "%s: the rule has only a concurrency limit, which is always decided exactly", sf.mode)
		}
	}
	r.Sync, r.Lease, r.SyncInterval, r.MaxUnsynced = sf.mode, sf.lease, sf.interval, sf.maxUnsynced
}
