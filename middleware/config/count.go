package config

import (
	"context"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/middleware"
)

// countFields are the fields of a rule's count mapping.
var countFields = []string{"status", "status_not"}

// maxStatuses bounds the length of a status list.
const maxStatuses = 64

// count decodes a rule's count: {status: [401, 403, "5xx"]} or
// {status_not: [...]}.
func (d *decoder) count(n *yaml.Node, path string) middleware.Count {
	var c middleware.Count
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping such as {status: [401, 403]} or {status_not: [2xx]}, got %s", describe(n))
		return c
	}
	var seen *yaml.Node
	d.fields(n, path, countFields, func(field string, v *yaml.Node) {
		fpath := path + "." + field
		if seen != nil {
			d.errorf(v, fpath, "status and status_not exclude each other: set one")
			return
		}
		seen = v
		list := d.statuses(v, fpath)
		if field == "status" {
			c.Status = list
		} else {
			c.StatusNot = list
		}
	})
	if seen == nil {
		d.errorf(n, path, "empty: want status or status_not")
	}
	return c
}

// statuses decodes a list of statuses: codes (401) and classes ("5xx").
func (d *decoder) statuses(n *yaml.Node, path string) []middleware.Status {
	if !d.seq(n, path) {
		return nil
	}
	if len(n.Content) == 0 {
		d.errorf(n, path, "empty: want statuses such as [401, 403, \"5xx\"]")
		return nil
	}
	if len(n.Content) > maxStatuses {
		d.errorf(n, path, "%d statuses: at most %d", len(n.Content), maxStatuses)
		return nil
	}
	out := make([]middleware.Status, 0, len(n.Content))
	for i, sn := range n.Content {
		sn = resolve(sn)
		ipath := path + "[" + strconv.Itoa(i) + "]"
		if sn.Kind != yaml.ScalarNode || (sn.ShortTag() != "!!int" && sn.ShortTag() != "!!str") {
			d.errorf(sn, ipath, "want a status such as 401 or \"5xx\", got %s", describe(sn))
			continue
		}
		s, err := middleware.ParseStatus(sn.Value)
		if err != nil {
			d.errorf(sn, ipath, "%v", err)
			continue
		}
		out = append(out, s)
	}
	return out
}

// TakeAt and Refund make nopStore a middleware.Refunder, so that rules
// that count by outcome can be checked too.
func (nopStore) TakeAt(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, time.Time, error) {
	return true, time.Now(), nil
}

func (nopStore) Refund(context.Context, time.Time, []middleware.Charge) error { return nil }

// ban decodes a limit's ban, such as "1h": how long a client the limit
// refuses is banned.
func (d *decoder) ban(n *yaml.Node, path string) time.Duration {
	w, ok := d.duration(n, path)
	if !ok {
		return 0
	}
	if w <= 0 || w%time.Millisecond != 0 || w > 3660*24*time.Hour {
		d.errorf(n, path, "%s: want a duration from 1ms to 3660 days, such as 1h", w)
		return 0
	}
	return w
}
