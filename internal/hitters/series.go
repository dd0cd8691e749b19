package hitters

// Series counts events in consecutive intervals of span ms, keeping the
// last n: a bounded ring buffer, for rates over a recent period.
type Series struct {
	span  int64
	slots []point
	// at and last are the instant of the last AddN and its point.
	at   int64
	last *point
}

// Point is what a Series counted in one interval.
type Point struct {
	// Start is when the interval starts (Unix ms).
	Start int64
	// Allowed and Denied count requests, AllowedUnits and DeniedUnits
	// their units.
	Allowed, Denied           uint64
	AllowedUnits, DeniedUnits uint64
}

type point struct {
	Point
	used bool
}

// NewSeries returns a Series of n intervals of span ms.
func NewSeries(span int64, n int) *Series {
	return &Series{span: span, slots: make([]point, n)}
}

// Add counts one event of units at now.
func (s *Series) Add(kind Kind, units uint64, now int64) { s.AddN(kind, 1, units, now) }

// AddN counts n events of units in all at now.
func (s *Series) AddN(kind Kind, n, units uint64, now int64) {
	p := s.last
	if p == nil || now != s.at {
		start := now - now%s.span
		p = &s.slots[int(start/s.span)%len(s.slots)]
		if !p.used || p.Start != start {
			if p.used && start < p.Start {
				return // older than the slot's interval: out of the series
			}
			*p = point{Point: Point{Start: start}, used: true}
		}
		s.at, s.last = now, p
	}
	if kind == Denied {
		p.Denied += n
		p.DeniedUnits += units
	} else {
		p.Allowed += n
		p.AllowedUnits += units
	}
}

// Points returns the n intervals up to the one of now, oldest first, with
// zeros for intervals without events.
func (s *Series) Points(now int64) []Point {
	n := int64(len(s.slots))
	cur := now - now%s.span
	out := make([]Point, n)
	for i := range out {
		start := cur - (n-1-int64(i))*s.span
		out[i].Start = start
		if p := &s.slots[int(start/s.span)%len(s.slots)]; p.used && p.Start == start {
			out[i] = p.Point
		}
	}
	return out
}

// Sum returns the totals of the intervals up to the one of now.
func (s *Series) Sum(now int64) Point {
	var t Point
	for _, p := range s.Points(now) {
		t.Allowed += p.Allowed
		t.Denied += p.Denied
		t.AllowedUnits += p.AllowedUnits
		t.DeniedUnits += p.DeniedUnits
	}
	return t
}
