package window

import (
	"math"
	"math/bits"
)

// Settling a cost after the fact.
//
// A limit whose cost is known only once a request has run (an LLM's
// tokens, a query's cost, bytes sent) charges an estimate when the request
// is admitted and settles the difference once it is done: a charge that
// cannot be refused, since the work is already done. Settle adds it to a
// counter whatever the counter holds, and a counter it takes past its
// limit is in debt (Decision.Debt): it admits nothing, Remaining is 0,
// and RetryAfter and NextAfter say when a request fits again, as for any
// count. How a debt is waited off is each algorithm's own way of letting
// counts go:
//
//   - Sliding window: the debt stays in the current count until the
//     window ends, then weighs in full as the previous count, which
//     decays to nothing over the next window (see the package doc): a
//     debt is waited off by the end of the window after the settle.
//   - Fixed window (and calendar periods): the count stays past the limit
//     until the window ends, and the next window starts empty. A fixed
//     window promises a quota that renews whole at known instants (a day
//     at midnight, a month on the 1st), and renews the excess of a
//     lowered plan or of a coordination mode's bound the same way; a
//     client can therefore use at most limit + its settles' excess in one
//     window, and the bound of the middleware holds per window.
//   - Sliding log: the settle is an entry at the settle's instant, and
//     counts for one window from then.
//   - Token bucket: the bucket goes below empty (its level, the tokens
//     spent, above the capacity) and refills at its rate: a debt of D
//     tokens takes D / Requests windows to refill before the next token is
//     there. A bucket owes at most its capacity and one token (its level
//     is capped at twice capacity + 1, see token.go): a debt is waited off
//     within one span more, like the sliding window's, and a plan lowered
//     from a huge burst never shuts a client out for ages.
//
// Every value stays exact below 2^53, as the Lua twins need: a sliding or
// fixed window's count is capped at MaxCount, a sliding log's sum at
// MaxLogCount, far beyond any debt a client can owe.

const (
	// MaxCount is the most a sliding or fixed window's count holds: a
	// settle that would take it further stops there.
	MaxCount = 1 << 52
	// MaxLogCount is the most a sliding log's entries sum to: 2^32-1, the
	// range of the four bytes the Redis store keeps an entry's count and
	// the sum in.
	MaxLogCount = 1<<32 - 1
)

// Settle charges cost c to the rolled state s at at under l, whether it
// fits or not, as Add charges an admitted cost: the difference between
// what a request used and what it was charged when admitted. A count
// stops at MaxCount, a sliding log's sum at MaxLogCount, a token bucket's
// level at twice its capacity + 1. c <= 0 changes nothing.
func Settle(s *State, at int64, l Limit, c int64) {
	if c <= 0 {
		return
	}
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		p := tokenParams(l)
		if c >= 2*(p.burst+1) {
			s.Curr = p.most()
		} else {
			s.Curr = min(s.Curr+c*p.w, p.most())
		}
	case SlidingLog:
		if c = min(c, MaxLogCount-s.Curr); c > 0 {
			Add(s, at, l, c)
		}
	default:
		if c > MaxCount-s.Curr {
			s.Curr = MaxCount
		} else {
			s.Curr += c
		}
	}
}

// SettleAll settles charges on states at now: it rolls every state to now
// and charges each charge's cost whether it fits or not (Settle), then
// writes one Decision per charge into out, describing the counter after
// the charge (Allowed is true; Debt says how far past its limit the
// charge took it). states, charges and out must have the same length, and
// the limits be valid; costs are what to charge, not what was used.
func SettleAll(states []State, now int64, charges []Charge, out []Decision) {
	for i := range charges {
		c := &charges[i]
		var at int64
		states[i], at = c.Limit.Roll(states[i], now)
		Settle(&states[i], at, c.Limit, int64(c.Cost))
		out[i] = Describe(states[i], at, c.Limit, int64(c.Cost), true)
	}
}

// describeLarge is describeTo for a sliding window whose counts exceed
// limit + 1 (a debt, or a plan lowered since): the products that compare
// them with the limit are taken on 128 bits, so that no value loses
// precision whatever the counts.
func (p *params) describeLarge(d *Decision, x *pos, c int64, allowed bool) {
	k := p.w - 1 - x.e
	// used is the estimate in units of 1/w: prev*k + curr*w.
	used := mul128(x.prev, k).add(mul128(x.curr, p.w))
	total := mul128(p.limit, p.w)
	*d = Decision{Allowed: allowed}
	var free int64 // when positive, below limit * w
	if used.less(total) {
		free = int64(total.sub(used).lo)
		d.Remaining = int(free / p.w)
	} else {
		d.Debt = int(used.sub(total).divCeil(p.w))
	}
	switch {
	case x.curr > 0:
		d.ResetAfter = p.ms(*x, 2*p.w-1-x.e)
	case x.prev > 0:
		d.ResetAfter = p.ms(*x, p.w-1-x.e)
	}
	if !allowed {
		d.RetryAfter = p.ms(*x, p.retry(*x, c))
		d.NextAfter = p.ms(*x, p.retry(*x, 1))
		return
	}
	rem := int64(d.Remaining)
	if rem >= p.limit {
		return
	}
	// Remaining grows once used <= total - (rem+1)*w: within the current
	// window used falls by prev per tick; in the next, y ticks in, it is
	// curr*(w-1-y) (see grow).
	if x.prev > 0 {
		need := used.add(mul128(rem+1, p.w)).sub(total)
		if t := need.divCeil(x.prev); t <= k {
			d.NextAfter = p.ms(*x, t)
			return
		}
	}
	y := int64(0)
	if x.curr > 0 {
		y = max(0, p.w-1-(p.limit-rem-1)*p.w/x.curr)
	}
	d.NextAfter = p.ms(*x, p.w-x.e+y)
}

// u128 is an unsigned 128-bit integer, for products of counts and ticks
// that exceed 64 bits.
type u128 struct{ hi, lo uint64 }

// mul128 returns a * b for a, b >= 0.
func mul128(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

// sub returns x - y for x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || x.hi == y.hi && x.lo < y.lo }

// divCeil returns x / d rounded up for d > 0, capped at the largest int64.
func (x u128) divCeil(d int64) int64 {
	if x.hi >= uint64(d) {
		return math.MaxInt64 // the quotient needs more than 64 bits
	}
	q, r := bits.Div64(x.hi, x.lo, uint64(d))
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// debtOf is over, an excess in units of 1/w, in whole units rounded up;
// 0 when there is none.
func debtOf(over, w int64) int {
	if over <= 0 {
		return 0
	}
	return int((over + w - 1) / w)
}
