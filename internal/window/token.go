package window

import (
	"math"
	"time"
)

// The token bucket, counted as the level of a leaky bucket so that the
// arithmetic stays on exact integers: a token is w "drops" (w = Window / R,
// the window in ticks), the bucket holds burst * w drops, and it refills
// (the level falls) by rate = Requests drops per tick, which is Requests
// tokens per Window. A request of cost c fits when level + c*w <= burst*w.
// With Limit.Tick keeping 3 * (max(Requests, Burst) + 1) * w <= 2^53 and
// the level capped at 2 * (burst + 1) * w, every value stays exact as a double
// too, which the Lua twin relies on. A level may exceed the capacity: a
// settle charges usage whatever the level (a debt, see settle.go), and a
// level charged under a larger burst is read under a smaller one. It is
// capped at twice capacity + 1 tokens (most): a bucket owes at most one
// capacity and a token, which it refills within one span more, and
// level + c*w stays within 3 * (burst + 1) * w.

// tparams are a token bucket in the units of its arithmetic.
type tparams struct {
	rate  int64 // drops refilled per tick: Requests
	burst int64 // capacity, in tokens
	r     int64 // tick, in ms
	w     int64 // drops per token: the window in ticks
}

func tokenParams(l Limit) tparams {
	r := l.Tick()
	return tparams{rate: int64(l.Requests), burst: int64(l.Capacity()), r: r, w: l.Window.Milliseconds() / r}
}

// most is the highest level: 2 * (burst + 1) tokens, in drops.
func (p tparams) most() int64 { return 2 * (p.burst + 1) * p.w }

// empty is how many ticks a level takes to drain.
func (p tparams) empty(level int64) int64 {
	return (level + p.rate - 1) / p.rate
}

func (p tparams) fits(level, c int64) bool {
	return c <= p.burst && level+c*p.w <= p.burst*p.w
}

func rollToken(l Limit, s State, now int64) (State, int64) {
	p := tokenParams(l)
	base := now - now%p.r
	if s.Curr <= 0 {
		return State{Start: base, Prev: p.r}, now
	}
	level, start := s.Curr, s.Start
	if s.Prev != p.r && s.Prev > 0 {
		// Counted in other ticks (the limit changed so much that its tick
		// did): re-express the level in whole tokens, rounded up, on the
		// new tick grid, as of the last instant it is known to hold. The
		// old ticks refilled nothing until the level's tick ended, so that
		// is now or that tick's last millisecond, whichever comes first;
		// dating it at the tick's start would refill, at the new rate,
		// tokens the old limit still counted as spent.
		oldW := max(l.Window.Milliseconds()/s.Prev, 1)
		tokens := min((level+oldW-1)/oldW, 2*(p.burst+1))
		level = tokens * p.w
		if base >= start {
			start = min(start+s.Prev-1, base)
		}
		start -= start % p.r
	}
	level = min(level, p.most())
	if base < start {
		// The clock went backwards: decide at the level's instant.
		return State{Start: start, Prev: p.r, Curr: level}, start
	}
	if elapsed := (base - start) / p.r; elapsed >= p.empty(level) {
		level = 0
	} else {
		level -= elapsed * p.rate
	}
	return State{Start: base, Prev: p.r, Curr: level}, now
}

// maxDelay is the longest delay a Decision holds, in milliseconds: the
// most whole milliseconds a time.Duration holds, about 292 years. Only a
// token bucket whose burst is many times its requests takes longer to
// refill; its delays are capped there.
const maxDelay = math.MaxInt64 / int64(time.Millisecond)

// ms converts a delay of d ticks from at to milliseconds: to the start of
// the tick d ticks after the one at lies in, the state's Start. Delays
// above maxDelay are capped.
func (p tparams) ms(s State, at, d int64) time.Duration {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return 0
	case d > (maxDelay+at-s.Start)/p.r:
		return time.Duration(maxDelay) * time.Millisecond
	}
	return time.Duration(d*p.r-(at-s.Start)) * time.Millisecond
}

// retry is the delay in ticks until cost c fits, -1 if never.
func (p tparams) retry(level, c int64) int64 {
	if c > p.burst {
		return -1
	}
	if excess := level + c*p.w - p.burst*p.w; excess > 0 {
		return (excess + p.rate - 1) / p.rate
	}
	return 0
}

func (p tparams) describe(s State, at, c int64, allowed bool) Decision {
	level := s.Curr
	d := Decision{Allowed: allowed}
	if free := p.burst*p.w - level; free > 0 {
		d.Remaining = int(free / p.w)
	} else {
		d.Debt = debtOf(-free, p.w)
	}
	d.ResetAfter = p.ms(s, at, p.empty(level))
	if allowed {
		if rem := int64(d.Remaining); rem < p.burst {
			// Remaining grows once level <= (burst - rem - 1) * w.
			d.NextAfter = p.ms(s, at, p.empty(level-(p.burst-rem-1)*p.w))
		}
	} else {
		d.RetryAfter = p.ms(s, at, p.retry(level, c))
		d.NextAfter = p.ms(s, at, p.retry(level, 1))
	}
	return d
}
