package window

import (
	"fmt"
	"time"
)

// Algorithm is how a limit counts requests. Every store implements every
// algorithm with the arithmetic of this package, so that stores can be
// swapped without changing what clients see.
type Algorithm uint8

const (
	// SlidingWindow is the sliding-window counter: a count per window and
	// a weighted share of the previous window's count. Near-exact (at most
	// Requests + 1 in any interval of one Window) at constant memory. It
	// is the default.
	SlidingWindow Algorithm = iota
	// FixedWindow counts requests in windows aligned to the Unix epoch (a
	// day renews at 00:00 UTC), or in calendar periods (see Period). The
	// quota renews whole at known instants; a client may spend it at the
	// end of one window and again at the start of the next, so up to
	// 2 * Requests pass in an interval of one Window that straddles a
	// boundary.
	FixedWindow
	// SlidingLog keeps the instant of every admitted request for one
	// Window: exact (at most Requests in any interval of one Window), at a
	// memory cost per client that grows with Requests (see MaxLog).
	SlidingLog
	// TokenBucket holds up to Burst tokens (Requests when Burst is 0) and
	// refills Requests tokens per Window, continuously; a request spends
	// one token per unit of cost. It admits bursts of Burst with a steady
	// average of Requests per Window: at most Burst + Requests in any
	// interval of one Window.
	TokenBucket
	// LeakyBucket is a queue drained at Requests per Window: a request
	// that comes when the queue is empty is admitted at once; one that
	// comes early is admitted with a Delay, its turn in the queue, if at
	// most Burst requests are ahead of it (Requests when Burst is 0) and
	// the wait is at most MaxDelay (when set); otherwise it is denied. The
	// requests it admits are released at the steady rate.
	LeakyBucket

	algorithms // the number of algorithms
)

var algorithmNames = [...]string{
	SlidingWindow: "sliding_window",
	FixedWindow:   "fixed_window",
	SlidingLog:    "sliding_log",
	TokenBucket:   "token_bucket",
	LeakyBucket:   "leaky_bucket",
}

// String returns the algorithm's name as the rules file spells it, such as
// "token_bucket".
func (a Algorithm) String() string {
	if a < algorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", a)
}

// ParseAlgorithm returns the algorithm named s ("sliding_window",
// "fixed_window", "sliding_log", "token_bucket" or "leaky_bucket").
func ParseAlgorithm(s string) (Algorithm, error) {
	for a, n := range algorithmNames {
		if n == s {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want sliding_window, fixed_window, sliding_log, token_bucket or leaky_bucket)", s)
}

// Period is a calendar period of a FixedWindow limit.
type Period uint8

const (
	// NoPeriod means the limit's Window, aligned to the Unix epoch.
	NoPeriod Period = iota
	// CalendarDay renews at midnight in the limit's Location.
	CalendarDay
	// CalendarWeek renews on Monday at midnight in the limit's Location.
	CalendarWeek
	// CalendarMonth renews on the first day of each month at midnight in
	// the limit's Location.
	CalendarMonth

	periods // the number of periods, NoPeriod included
)

var periodNames = [...]string{
	NoPeriod:      "",
	CalendarDay:   "calendar_day",
	CalendarWeek:  "calendar_week",
	CalendarMonth: "calendar_month",
}

// String returns the period's name as the rules file spells it, such as
// "calendar_month", or "" for NoPeriod.
func (p Period) String() string {
	if p < periods {
		return periodNames[p]
	}
	return fmt.Sprintf("Period(%d)", p)
}

// ParsePeriod returns the period named s ("calendar_day", "calendar_week"
// or "calendar_month"), and false if s names none.
func ParsePeriod(s string) (Period, bool) {
	for p, n := range periodNames {
		if p != 0 && n == s {
			return Period(p), true
		}
	}
	return NoPeriod, false
}

// nominal is the period's length as headers advertise it: 1, 7 and 30
// days.
func (p Period) nominal() time.Duration {
	switch p {
	case CalendarDay:
		return 24 * time.Hour
	case CalendarWeek:
		return 7 * 24 * time.Hour
	case CalendarMonth:
		return 30 * 24 * time.Hour
	}
	return 0
}

// bounds returns the start and end (Unix ms) of the period that contains
// at in loc. A period starts at the first instant its first date is shown
// in loc: its midnight, or where a time-zone change skips midnight (a
// daylight-saving change at 00:00) or shows it twice, the first instant of
// that date. If the local date goes back across a period's start (a change
// at 00:30 to 23:30), the instants shown on the earlier date belong to the
// later period, so periods never overlap; the result always contains at.
func (p Period) bounds(at int64, loc *time.Location) (start, end int64) {
	t := time.UnixMilli(at).In(loc)
	y, m, d := t.Date()
	switch p {
	case CalendarWeek:
		d -= (int(t.Weekday()) + 6) % 7 // back to Monday
	case CalendarMonth:
		d = 1
	}
	for {
		ny, nm, nd := y, m, d+1
		switch p {
		case CalendarWeek:
			nd = d + 7
		case CalendarMonth:
			nm, nd = m+1, 1
		}
		start, end = firstInstant(y, m, d, loc), firstInstant(ny, nm, nd, loc)
		if end > at {
			return min(start, at), end
		}
		y, m, d = ny, nm, nd
	}
}

// firstInstant returns, in Unix ms, the first instant at which the date
// shown in loc is y-m-d (normalised as time.Date does) or later. time.Date
// alone is not enough: for a midnight that does not exist it may return an
// instant of the day before, and for one shown twice the second.
func firstInstant(y int, m time.Month, d int, loc *time.Location) int64 {
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() // as shown
	// Walk the zones in effect from two days before time.Date's answer
	// (offsets differ by at most 26 hours). Within one zone the shown time
	// runs with the instant, so the zone's first instant shown at or after
	// midnight is the later of its start and of midnight less its offset.
	for t := time.Date(y, m, d, 0, 0, 0, 0, loc).Add(-48 * time.Hour); ; {
		_, off := t.Zone()
		from, to := t.ZoneBounds()
		c := midnight - int64(off)
		if !from.IsZero() {
			c = max(c, from.Unix())
		}
		if to.IsZero() || c < to.Unix() {
			return c * 1000
		}
		t = to
	}
}

// Bounds returns the start and end, in Unix ms, of the fixed window of l
// that contains at: [at - at mod Window, +Window) for a Window aligned to
// the Unix epoch, the calendar period in l.Location otherwise. l must be a
// valid FixedWindow limit and at >= 0.
func (l Limit) Bounds(at int64) (start, end int64) {
	if l.Period != NoPeriod {
		return l.Period.bounds(at, l.loc())
	}
	w := l.Window.Milliseconds()
	start = at - at%w
	return start, start + w
}

// Boundaries returns four consecutive window boundaries of the FixedWindow
// limit l around at: the start of the window before the one containing
// at, the start and end of that window, and the end of the next one. A
// store whose clock is elsewhere (Redis TIME) picks, among the three
// windows they delimit, the one that contains its own instant, which lets
// calendar periods be decided where no time-zone database exists.
func (l Limit) Boundaries(at int64) [4]int64 {
	s, e := l.Bounds(at)
	p, _ := l.Bounds(max(s-1, 0))
	_, n := l.Bounds(e)
	return [4]int64{p, s, e, n}
}

// TokenBucket returns l counted by a token bucket that refills l.Requests
// tokens per l.Window and holds burst tokens (0 means l.Requests):
// PerSecond(4).TokenBucket(8) admits 8 at once, then 4 per second.
func (l Limit) TokenBucket(burst int) Limit {
	l.Algorithm, l.Burst = TokenBucket, burst
	return l
}

// FixedWindow returns l counted in fixed windows aligned to the Unix
// epoch: PerDay(1000).FixedWindow() renews at 00:00 UTC.
func (l Limit) FixedWindow() Limit {
	l.Algorithm = FixedWindow
	return l
}

// SlidingLog returns l counted by a sliding log, exact: at most l.Requests
// in any interval of l.Window. Requests may not exceed DefaultMaxLog
// unless MaxLog raises the bound.
func (l Limit) SlidingLog() Limit {
	l.Algorithm = SlidingLog
	return l
}

// LeakyBucket returns l counted by a leaky bucket used as a queue: it
// releases l.Requests per l.Window, and lets up to queue requests wait
// for their turn (0 means l.Requests), each for at most maxDelay (0 means
// no bound beyond the queue's length): PerSecond(2).LeakyBucket(10, 3*time.Second).
func (l Limit) LeakyBucket(queue int, maxDelay time.Duration) Limit {
	l.Algorithm, l.Burst, l.MaxDelay = LeakyBucket, queue, maxDelay
	return l
}
