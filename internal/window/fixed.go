package window

import "time"

// The fixed window: one count per window, renewed whole when the window
// ends. Windows are aligned to the Unix epoch, or are calendar periods
// (Limit.Bounds); a state whose Start is not the start of the window that
// contains now is stale and starts afresh.

func rollFixed(l Limit, s State, now int64) (State, int64) {
	if s.Curr != 0 && now < s.Start {
		return s, s.Start // the clock went backwards: keep the count
	}
	start, _ := l.Bounds(now)
	if s.Curr != 0 && s.Start == start {
		return s, now
	}
	return State{Start: start}, now
}

func describeFixed(l Limit, s State, at, c int64, allowed bool) Decision {
	_, end := l.Bounds(at)
	left := time.Duration(end-at) * time.Millisecond
	limit := int64(l.Requests)
	d := Decision{Allowed: allowed}
	if s.Curr < limit {
		d.Remaining = int(limit - s.Curr)
	} else {
		d.Debt = int(s.Curr - limit)
	}
	if s.Curr > 0 {
		d.ResetAfter = left
	}
	switch {
	case allowed:
		if s.Curr > 0 {
			d.NextAfter = left
		}
	case c > limit:
		d.RetryAfter = -1
		d.NextAfter = left
		if s.Curr+1 <= limit {
			d.NextAfter = 0
		}
	default:
		// The request did not fit this window, and fits the next, which
		// starts empty.
		d.RetryAfter = left
		d.NextAfter = left
		if s.Curr+1 <= limit {
			d.NextAfter = 0
		}
	}
	return d
}
