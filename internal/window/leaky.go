package window

// The leaky bucket as a queue shares the token bucket's arithmetic (see
// token.go) with a capacity of queue + 1 tokens: the level is the work
// ahead, in drops, and it drains at rate drops per tick. A request of cost
// c may join when level + c*w <= (queue+1)*w, that is when at most queue
// units wait ahead of it once the one being served is counted, and when
// its wait, the time for the level ahead of it to drain, is at most
// MaxDelay: ceil(level / rate) ticks <= maxWait, or level <= maxWait*rate.
// Joining adds c*w to the level, so the next request waits c*w/rate ticks
// longer: the admitted requests leave at the steady rate.

// lparams are a leaky bucket: a token bucket of capacity queue + 1 and
// the longest wait, in ticks (-1 for none).
type lparams struct {
	tparams
	maxWait int64
}

func leakyParams(l Limit) lparams {
	p := lparams{tparams: tokenParams(l), maxWait: -1}
	if l.MaxDelay > 0 {
		p.maxWait = l.MaxDelay.Milliseconds() / p.r
	}
	return p
}

func (p lparams) fits(level, c int64) bool {
	return p.tparams.fits(level, c) && (p.maxWait < 0 || level <= p.maxWait*p.rate)
}

// retry is the delay in ticks until cost c may join, -1 if never.
func (p lparams) retry(level, c int64) int64 {
	if c > p.burst {
		return -1
	}
	bound := (p.burst - c) * p.w
	if p.maxWait >= 0 {
		bound = min(bound, p.maxWait*p.rate)
	}
	if excess := level - bound; excess > 0 {
		return (excess + p.rate - 1) / p.rate
	}
	return 0
}

func (p lparams) describe(s State, at, c int64, allowed bool) Decision {
	d := p.tparams.describe(s, at, c, allowed)
	if p.maxWait >= 0 && s.Curr > p.maxWait*p.rate {
		// The next request would wait too long, whatever its cost.
		d.Remaining = 0
		if allowed {
			d.NextAfter = p.ms(s, at, p.retry(s.Curr, 1))
		}
	}
	if allowed {
		// The wait is for the work that was ahead of this request.
		d.Delay = p.ms(s, at, p.empty(max(s.Curr-c*p.w, 0)))
	} else {
		d.RetryAfter = p.ms(s, at, p.retry(s.Curr, c))
		d.NextAfter = p.ms(s, at, p.retry(s.Curr, 1))
	}
	return d
}

// GiveBack takes cost c off the rolled state s of a LeakyBucket or a
// TokenBucket, never below empty: what a store does when a request that
// was admitted with a Delay leaves before its turn, so that the requests
// after it do not wait for it. Later requests keep the turns they were
// given; the next one to join takes the place given back.
func GiveBack(s *State, l Limit, c int64) {
	if w := tokenParams(l).w; c < (s.Curr+w-1)/w {
		s.Curr -= c * w
	} else {
		s.Curr = 0
	}
}
