package window

import "time"

// The sliding log: every admitted request is an entry, and a request fits
// when the entries of the last Window plus its cost are within the limit.
// An entry admitted at t counts during [t, t + Window).

func rollLog(l Limit, s State, now int64) (State, int64) {
	at := now
	if n := len(s.Log); n > 0 && s.Log[n-1].At > at {
		at = s.Log[n-1].At // the clock went backwards
	}
	cut := at - l.Window.Milliseconds()
	k := 0
	for k < len(s.Log) && s.Log[k].At <= cut {
		s.Curr -= s.Log[k].N
		k++
	}
	s.Log = s.Log[k:]
	if len(s.Log) == 0 || s.Curr < 0 {
		s.Curr = 0
		for _, e := range s.Log {
			s.Curr += e.N
		}
	}
	return State{Curr: s.Curr, Log: s.Log}, at
}

// LogSummary is what a decision needs to know of a rolled sliding log:
// what the Redis script returns in place of the log itself.
type LogSummary struct {
	// Count is the sum of the entries' costs.
	Count int64
	// Oldest and Newest are the instants of the oldest and newest
	// entries; they mean nothing when Count is 0.
	Oldest, Newest int64
	// RetryC is the instant of the entry whose leaving lets the request's
	// cost c fit, and Retry1 the same for a cost of 1; -1 when it fits
	// already, or never will (c above the limit). Charge leaves them as
	// they were: a summary charged with a settle that took the log past
	// its limit needs Retry1 of the charged log (see SettleAll).
	RetryC, Retry1 int64
}

// Summarize returns the summary of the rolled sliding log s at at for a
// request of cost c.
func Summarize(l Limit, s State, at, c int64) LogSummary {
	sum := LogSummary{Count: s.Curr, RetryC: -1, Retry1: -1}
	if n := len(s.Log); n > 0 {
		sum.Oldest, sum.Newest = s.Log[0].At, s.Log[n-1].At
	}
	limit := int64(l.Requests)
	leaving := func(need int64) int64 {
		for _, e := range s.Log {
			if need -= e.N; need <= 0 {
				return e.At
			}
		}
		return -1
	}
	if need := s.Curr + c - limit; need > 0 && c <= limit {
		sum.RetryC = leaving(need)
	}
	if need := s.Curr + 1 - limit; need > 0 {
		sum.Retry1 = leaving(need)
	}
	return sum
}

// Charge records in the summary a request of cost c admitted at at.
func (s *LogSummary) Charge(at, c int64) {
	if c == 0 {
		return
	}
	if s.Count == 0 {
		s.Oldest = at
	}
	s.Count += c
	s.Newest = at
}

// DescribeLog computes the Decision of a sliding log from its summary at
// at, taken after the request's cost was charged if it was admitted.
func DescribeLog(l Limit, s LogSummary, at, c int64, allowed bool) Decision {
	w, limit := l.Window.Milliseconds(), int64(l.Requests)
	until := func(t int64) time.Duration {
		if t < 0 {
			return 0
		}
		return time.Duration(t+w-at) * time.Millisecond
	}
	d := Decision{Allowed: allowed}
	if s.Count < limit {
		d.Remaining = int(limit - s.Count)
	} else {
		d.Debt = int(s.Count - limit)
	}
	if s.Count > 0 {
		d.ResetAfter = until(s.Newest)
	}
	switch {
	case allowed && s.Count > limit:
		// In debt after a settle: Remaining grows once one unit fits.
		d.NextAfter = until(s.Retry1)
	case allowed:
		if s.Count > 0 {
			d.NextAfter = until(s.Oldest)
		}
	case c > limit:
		d.RetryAfter = -1
		d.NextAfter = until(s.Retry1)
	default:
		d.RetryAfter = until(s.RetryC)
		d.NextAfter = until(s.Retry1)
	}
	return d
}
