package adaptive

import "time"

// Priority orders requests for shedding: Sheddable requests are refused
// first, then Normal, then High; Critical ones only at the hard limit.
type Priority uint8

// The priorities, lowest first.
const (
	Sheddable Priority = iota
	Normal
	High
	Critical
	NumPriorities
)

// Shedder admits requests of different priorities against one adaptive
// concurrency limit. A request of priority p is admitted while the
// requests in flight are fewer than its threshold:
//
//	Sheddable  limit/2
//	Normal     limit
//	High       limit + (hard - limit)/2
//	Critical   hard
//
// where limit is the adaptive limit and hard the hard limit (the rule's
// maximum). Once a request of priority p has been refused, every request
// of a lower priority is refused too for Hold, whatever the count in
// flight: no request of lower priority is admitted during the Hold that
// follows a refusal, so a refused critical request is never followed by an
// admitted sheddable one within Hold.
//
// A Shedder is not safe for concurrent use.
type Shedder struct {
	// Hold is how long a refusal of priority p keeps every lower
	// priority refused; 0 means 1s.
	Hold time.Duration

	until [NumPriorities]time.Time // priority p is shut until until[p]
}

// Threshold returns how many requests may be in flight for a request of
// priority p to be admitted, given the adaptive limit and the hard limit.
func Threshold(p Priority, limit, hard int) int {
	switch p {
	case Sheddable:
		return max(limit/2, 1)
	case Normal:
		return limit
	case High:
		return limit + max(hard-limit, 0)/2
	}
	return max(hard, limit)
}

// Admit reports whether a request of priority p may start at now with
// inflight requests in flight.
func (s *Shedder) Admit(now time.Time, p Priority, inflight, limit, hard int) bool {
	if p >= NumPriorities {
		p = Critical
	}
	if now.Before(s.until[p]) {
		return false // shut by a refusal of higher priority
	}
	if inflight >= Threshold(p, limit, hard) {
		s.refused(now, p)
		return false
	}
	return true
}

// refused shuts every priority below p for Hold.
func (s *Shedder) refused(now time.Time, p Priority) {
	hold := s.Hold
	if hold <= 0 {
		hold = time.Second
	}
	end := now.Add(hold)
	for q := Priority(0); q < p; q++ {
		if end.After(s.until[q]) {
			s.until[q] = end
		}
	}
}
