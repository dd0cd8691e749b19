package adaptive

import "time"

// Elastic turns spare capacity into how far elastic limits open towards
// their ceilings: a factor in [0, 1], where 0 means every limit is at its
// own value and 1 at its ceiling. The factor follows the spare capacity
// down at once, and back up only after CoolOff without a fall, by at most
// 1/Rise per second, so that a client let past its limit is pulled back
// the moment the service needs the room and let go again slowly.
//
// The factor the spare capacity asks for is spare/FullAt, at most 1: the
// ceilings are fully open while at least FullAt of the capacity is spare.
//
// An Elastic is not safe for concurrent use.
type Elastic struct {
	// FullAt is the spare capacity at and above which the ceilings are
	// fully open; 0 means 0.5.
	FullAt float64
	// CoolOff is how long the factor stays down after it last fell before
	// it rises again; 0 means 2s.
	CoolOff time.Duration
	// Rise is how long the factor takes to go from 0 to 1 once it rises;
	// 0 means 3s.
	Rise time.Duration

	factor float64
	fell   time.Time // when the factor last fell
	last   time.Time // when Update last ran
	begun  bool
}

// Factor returns the factor in force.
func (e *Elastic) Factor() float64 { return e.factor }

// Update moves the factor to now, given the spare capacity in [0, 1], and
// returns it. The first call sets the factor to what spare asks for.
func (e *Elastic) Update(now time.Time, spare float64) float64 {
	fullAt, coolOff, rise := e.FullAt, e.CoolOff, e.Rise
	if fullAt <= 0 {
		fullAt = 0.5
	}
	if coolOff <= 0 {
		coolOff = 2 * time.Second
	}
	if rise <= 0 {
		rise = 3 * time.Second
	}
	target := min(max(spare/fullAt, 0), 1)
	if !e.begun {
		e.begun, e.factor, e.last = true, target, now
		return e.factor
	}
	dt := now.Sub(e.last)
	if dt < 0 {
		dt = 0
	}
	e.last = now
	switch {
	case target < e.factor:
		e.factor, e.fell = target, now
	case target > e.factor && now.Sub(e.fell) >= coolOff:
		// Rising starts at the end of the cool-off, not at the last call.
		if since := now.Sub(e.fell) - coolOff; since < dt {
			dt = since
		}
		e.factor = min(target, e.factor+float64(dt)/float64(rise))
	}
	return e.factor
}

// Effective returns the limit in force for a limit with a ceiling at
// factor f: limit + ⌊(ceiling - limit)·f⌋, never below limit.
func Effective(limit, ceiling int, f float64) int {
	if ceiling <= limit || f <= 0 {
		return limit
	}
	if f >= 1 {
		return ceiling
	}
	return limit + int(float64(ceiling-limit)*f+1e-9)
}
