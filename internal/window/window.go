// Package window holds the vocabulary shared by every store and the pure
// arithmetic of the sliding-window counter.
//
// Time is cut into fixed windows of length W, aligned on the Unix epoch. A
// counter keeps the count of the current window and of the one before it.
// At an instant t that lies elapsed into the current window, the estimated
// number of requests in the sliding window that ends at t is
//
//	estimate = prev * (W - elapsed) / W + curr
//
// A request of cost c is allowed when estimate + c <= limit; only an allowed
// request is counted.
//
// All arithmetic is done on integer milliseconds and exact integers, with no
// floating point, so that the Redis Lua script (whose numbers are doubles)
// and this package give identical answers as long as every product stays
// below 2^53. Limit.Validate enforces that bound.
package window

import (
	"fmt"
	"time"
)

// MaxProduct is the largest value of Requests * Window-in-milliseconds that
// a Limit may have. It keeps every intermediate value of the algorithm
// exactly representable in an IEEE-754 double, which is what Redis Lua uses.
const MaxProduct = 1 << 50

// Limit is a number of requests allowed per window.
type Limit struct {
	// Requests is how many requests (cost units) the window admits.
	Requests int
	// Window is the length of the window. It must be a whole number of
	// milliseconds.
	Window time.Duration
}

// String returns the limit as "100/1m0s".
func (l Limit) String() string {
	return fmt.Sprintf("%d/%s", l.Requests, l.Window)
}

// Validate reports whether the limit can be used, with an error that says
// what is wrong when it cannot.
func (l Limit) Validate() error {
	switch {
	case l.Requests <= 0:
		return fmt.Errorf("limit %s: requests must be > 0", l)
	case l.Window <= 0:
		return fmt.Errorf("limit %s: window must be > 0", l)
	case l.Window%time.Millisecond != 0:
		return fmt.Errorf("limit %s: window must be a whole number of milliseconds", l)
	case int64(l.Requests) > MaxProduct/l.Window.Milliseconds():
		return fmt.Errorf("limit %s: requests * window (in ms) must not exceed 2^50", l)
	}
	return nil
}

// Charge asks a store to count Cost against Limit for the counter named by
// Name and Key.
type Charge struct {
	// Key identifies who is counted, for example "ip:192.0.2.1". It is
	// derived from the request and may be hostile; stores hash or escape it.
	// Charges with the same Key are kept close together (on Redis Cluster,
	// in one hash slot). Key may be backed by a buffer that is reused after
	// Take returns: a store that keeps it must copy it.
	Key string
	// Name namespaces the counters of different rules that count the same
	// Key. It comes from configuration, not from the request.
	Name string
	// Limit is the limit to apply. The counter is identified by Name, Key
	// and Limit.Window; Limit.Requests may change from call to call (plans)
	// without resetting it.
	Limit Limit
	// Cost is how many units the request consumes; 0 only reads.
	Cost int
}

// Decision is the outcome of one Charge.
type Decision struct {
	// Allowed reports whether this limit, on its own, admits the request.
	Allowed bool
	// Remaining is how many more requests of cost 1 this limit would admit
	// right now, after this request was counted (if it was).
	Remaining int
	// ResetAfter is how long until the whole limit is available again if
	// no further request arrives.
	ResetAfter time.Duration
	// RetryAfter is how long until a request of the same cost would be
	// admitted by this limit, if no further request arrives. It is zero
	// when Allowed is true.
	RetryAfter time.Duration
}

// State is a counter: the start of its current window in Unix milliseconds
// and the counts of the current and previous windows.
type State struct {
	Start int64
	Prev  int64
	Curr  int64
}

// Roll moves s to the window that contains now (Unix milliseconds) for
// windows of w milliseconds. An instant earlier than s's window (a clock that
// went backwards) is treated as the start of s's window, so a counter never
// loses counts to clock skew.
func Roll(s State, now, w int64) (State, int64) {
	start := now - floorMod(now, w)
	switch {
	case start == s.Start:
		return s, now
	case start < s.Start:
		return s, s.Start
	case start == s.Start+w:
		return State{Start: start, Prev: s.Curr}, now
	default:
		return State{Start: start}, now
	}
}

// Fits reports whether a request of cost c fits limit under state s at now
// (Unix milliseconds). s must already be rolled to now.
func Fits(s State, now int64, limit, w, c int64) bool {
	if c > limit {
		return false // also keeps (s.Curr+c)*w from overflowing
	}
	elapsed := now - s.Start
	return s.Prev*(w-elapsed)+(s.Curr+c)*w <= limit*w
}

// Describe computes the Decision for state s at now (Unix milliseconds). s
// must already be rolled to now and, if the request was admitted, already
// charged. allowed is whether this limit admits the request and c the
// request's cost, used for RetryAfter when allowed is false.
func Describe(s State, now int64, limit, w, c int64, allowed bool) Decision {
	elapsed := now - s.Start
	used := s.Prev*(w-elapsed) + s.Curr*w // estimate * w
	d := Decision{Allowed: allowed}
	if free := limit*w - used; free > 0 {
		d.Remaining = int(free / w)
	}
	switch {
	case s.Curr > 0:
		d.ResetAfter = ms(2*w - elapsed)
	case s.Prev > 0:
		d.ResetAfter = ms(w - elapsed)
	}
	if !allowed {
		d.RetryAfter = ms(retryAfter(s, elapsed, limit, w, c))
	}
	return d
}

// retryAfter is the smallest delay d in milliseconds after which a request
// of cost c fits, assuming no other request arrives.
func retryAfter(s State, elapsed, limit, w, c int64) int64 {
	if c > limit {
		return -1
	}
	// Within the current window: prev*(w-elapsed-d) + (curr+c)*w <= limit*w.
	if a := limit - s.Curr - c; a >= 0 {
		if s.Prev == 0 {
			return 0
		}
		return max(0, w-elapsed-a*w/s.Prev)
	}
	// In the next window, x into it: curr*(w-x) + c*w <= limit*w.
	x := w - (limit-c)*w/s.Curr
	return w - elapsed + x
}

// Take applies charges to states at now, all or nothing: it rolls every
// state, and only if every charge fits does it add each charge's cost. It
// writes one Decision per charge into out and reports whether the request
// was admitted. states, charges and out must have the same length. A charge
// whose cost exceeds its limit is never admitted and its RetryAfter is -1ns.
func Take(states []State, now int64, charges []Charge, out []Decision) bool {
	all := true
	for i := range charges {
		w := charges[i].Limit.Window.Milliseconds()
		var at int64
		states[i], at = Roll(states[i], now, w)
		ok := Fits(states[i], at, int64(charges[i].Limit.Requests), w, int64(charges[i].Cost))
		out[i].Allowed = ok
		all = all && ok
	}
	for i := range charges {
		c := &charges[i]
		w := c.Limit.Window.Milliseconds()
		at := max(now, states[i].Start)
		if all {
			states[i].Curr += int64(c.Cost)
		}
		out[i] = Describe(states[i], at, int64(c.Limit.Requests), w, int64(c.Cost), out[i].Allowed)
	}
	return all
}

// Expiry is how long after its last update a counter with windows of w can
// still influence a decision: the rest of its window plus the next one. now
// is the instant of the update in Unix milliseconds.
func Expiry(start, now, w int64) time.Duration {
	return ms(start + 2*w - now)
}

func ms(v int64) time.Duration {
	if v < 0 {
		return -1
	}
	return time.Duration(v) * time.Millisecond
}

func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// Millis converts t to Unix milliseconds.
func Millis(t time.Time) int64 { return t.UnixMilli() }
