package window

// Refund takes back cost c that a request admitted at at (Unix ms) was
// charged under l, from the counter's current state s, never below zero,
// and reports whether it changed s. It is what a store does when a rule
// counts only some responses (by their status) and the response of an
// admitted request is not one of them: the charge was made before the
// handler ran, so that concurrent requests could not exceed the limit, and
// is now given back.
//
//   - Sliding window: the charge is in the current window if at lies in
//     it ([Start, Start+w)), and is taken off the current count; in the
//     previous count if at lies in the window before. A charge that has
//     left both windows no longer counts and nothing changes.
//   - Fixed window (epoch-aligned or a calendar period): taken off the
//     count if the counter is still in the window that contains at.
//   - Token bucket: c tokens go back into the bucket (GiveBack), whatever
//     the time, since a token charged stays spent until it refills.
//   - Sliding log: taken off the entry of the instant at, if the log
//     still holds one (entries merge per millisecond, so it may hold the
//     costs of other requests of that millisecond too); the entry goes
//     when nothing is left of it. s.Log is changed in place.
//
// The leaky bucket is not refunded (Refundable); s must be the counter as
// stored (not rolled).
func Refund(s *State, l Limit, at, c int64) bool {
	if c <= 0 {
		return false
	}
	switch l.Algorithm {
	case SlidingWindow:
		w := l.Window.Milliseconds()
		switch {
		case at >= s.Start && at < s.Start+w && s.Curr > 0:
			s.Curr = max(s.Curr-c, 0)
		case at >= s.Start-w && at < s.Start && s.Prev > 0:
			s.Prev = max(s.Prev-c, 0)
		default:
			return false
		}
		return true
	case FixedWindow:
		if start, _ := l.Bounds(at); start != s.Start || s.Curr <= 0 {
			return false
		}
		s.Curr = max(s.Curr-c, 0)
		return true
	case TokenBucket:
		if s.Curr <= 0 {
			return false
		}
		if s.Prev != tokenParams(l).r && s.Prev > 0 {
			// Counted in other ticks since: the limit changed. Tokens
			// of the old ticks are rounded as Roll rounds them.
			w := max(l.Window.Milliseconds()/s.Prev, 1)
			s.Curr = max(s.Curr-c*w, 0)
			return true
		}
		GiveBack(s, l, c)
		return true
	case SlidingLog:
		for i := len(s.Log) - 1; i >= 0; i-- {
			e := &s.Log[i]
			if e.At > at {
				continue
			}
			if e.At < at {
				return false
			}
			n := min(e.N, c)
			s.Curr = max(s.Curr-n, 0)
			if e.N -= n; e.N == 0 {
				s.Log = append(s.Log[:i], s.Log[i+1:]...)
			}
			return true
		}
	}
	return false
}

// Refundable reports whether Refund can take back charges of l: a sliding
// window, a fixed window, a token bucket or a sliding log.
func Refundable(l Limit) bool {
	switch l.Algorithm {
	case SlidingWindow, FixedWindow, TokenBucket, SlidingLog:
		return true
	}
	return false
}
