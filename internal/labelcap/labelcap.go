// Package labelcap maps the values of a metric label that come from
// configuration (rule names) to the series that count them, keeping at
// most a fixed number of distinct values: past the cap, new values share
// one series under an "other" label. It serves the nested metrics modules
// (Prometheus and OpenTelemetry), which count the same way.
//
// Reads are lock-free (a map published through an atomic pointer); adding
// a value copies the map under a lock, which happens once per value.
package labelcap

import (
	"sync"
	"sync/atomic"
)

// Table maps label values to series of type S.
type Table[S any] struct {
	max       int
	other     string
	newSeries func(label string) *S
	mu        sync.Mutex // held to add a value
	cur       atomic.Pointer[table[S]]
}

// table is never changed once published.
type table[S any] struct {
	byName map[string]*S // every value seen, those folded into other too (up to a bound)
	labels []string      // one per series, other included
	series []*S
}

// New returns a Table that keeps at most max distinct values, folding the
// others into one series labelled other; newSeries makes the series of a
// label.
func New[S any](max int, other string, newSeries func(label string) *S) *Table[S] {
	t := &Table[S]{max: max, other: other, newSeries: newSeries}
	t.cur.Store(&table[S]{byName: map[string]*S{}})
	return t
}

// Get returns the series of the value name, adding it, or folding it into
// the other series past the cap.
func (t *Table[S]) Get(name string) *S {
	if s, ok := t.cur.Load().byName[name]; ok {
		return s
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.cur.Load()
	if s, ok := cur.byName[name]; ok {
		return s
	}
	label := name
	if len(cur.series) >= t.max {
		label = t.other
	}
	var s *S
	for i, l := range cur.labels {
		if l == label {
			s = cur.series[i]
			break
		}
	}
	if s != nil && len(cur.byName) >= 4*t.max {
		// Values folded into an existing series are remembered only up
		// to a bound; past it they take this slower path every time.
		return s
	}
	next := &table[S]{byName: make(map[string]*S, len(cur.byName)+1), labels: cur.labels, series: cur.series}
	for k, v := range cur.byName {
		next.byName[k] = v
	}
	if s == nil {
		s = t.newSeries(label)
		n := len(cur.series)
		next.labels = append(cur.labels[:n:n], label)
		next.series = append(cur.series[:n:n], s)
	}
	next.byName[name] = s
	t.cur.Store(next)
	return s
}

// Each calls fn with every label and its series, in the order they were
// added.
func (t *Table[S]) Each(fn func(label string, s *S)) {
	cur := t.cur.Load()
	for i, s := range cur.series {
		fn(cur.labels[i], s)
	}
}
