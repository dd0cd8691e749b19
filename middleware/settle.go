package middleware

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Refunder is implemented by stores that can give back charges they
// admitted: the memory and Redis stores. Rules that count only some
// responses (Rule.Count) need one: their requests are charged before the
// handler runs and the charge is given back when the response does not
// count.
type Refunder interface {
	// TakeAt is Take that also returns the instant the charges were
	// decided at (the store's clock when now is the zero time).
	TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (allowed bool, at time.Time, err error)
	// Refund gives back the costs of charges admitted at at: off a
	// sliding window's count of the window that holds at, a fixed
	// window's count if it is still that window, a token bucket's level;
	// never below zero.
	Refund(ctx context.Context, at time.Time, charges []Charge) error
}

// settlement is what an admitted request owes the rules that count by
// outcome: their charges, given back by Finish if the status does not
// count.
type settlement struct {
	l       *Limiter
	store   Refunder
	at      time.Time
	charges []Charge
	counts  []*Count
	once    sync.Once
}

// Finish ends a request: it gives back the request's concurrency slots
// (as Done does) and, for rules that count by outcome (Rule.Count), gives
// back the request's charges if the response's status does not count.
// Front ends call it once the handler has returned, with the status the
// client got, or 0 if the handler panicked (counted as 500); Handler and
// the Gin, Echo and Fiber adapters do. It is safe to call on any Result,
// more than once, and from any goroutine: only the first call settles.
func (res *Result) Finish(status int) {
	if s := res.settle; s != nil {
		if status == 0 {
			status = panicStatus
		}
		s.once.Do(func() { s.finish(status) })
	}
	res.Done()
}

func (s *settlement) finish(status int) {
	var back []Charge
	for i := range s.charges {
		if !s.counts[i].Counts(status) {
			back = append(back, s.charges[i])
		}
	}
	if len(back) == 0 {
		return
	}
	// The stores bound their own calls (the Redis store by its Timeout).
	if err := s.store.Refund(context.Background(), s.at, back); err != nil {
		// The charges stay counted: it errs on the side of refusing.
		s.l.cfg.report(nil, fmt.Errorf("%w: give back the charge of an uncounted response (status %d) of rule %q: %w", ErrStore, status, back[0].Name, err))
	}
}

// countingRules are the rules of a set that count by outcome, by name.
type countingRules map[string]*Count

// any reports whether a charge is of a rule that counts by outcome: the
// request is then decided by the store itself (TakeAt), exactly, whatever
// the rules' sync modes, so that its charges can be given back.
func (cr countingRules) any(charges []Charge) bool {
	for i := range charges {
		if _, ok := cr[charges[i].Name]; ok {
			return true
		}
	}
	return false
}

// counting returns the rules of set that count by outcome, nil if none.
func counting(rules []*compiledRule) countingRules {
	var m countingRules
	for _, r := range rules {
		if !r.Count.IsZero() {
			if m == nil {
				m = countingRules{}
			}
			m[r.Name] = &r.Count
		}
	}
	return m
}

// compileCount checks a rule's Count.
func (c *compiledRule) compileCount() error {
	if c.Count.IsZero() {
		return nil
	}
	if err := c.Count.validate(); err != nil {
		return err
	}
	c.Count = Count{Status: append([]Status(nil), c.Count.Status...), StatusNot: append([]Status(nil), c.Count.StatusNot...)}
	switch {
	case c.Deny:
		return fmt.Errorf("count: a Deny rule charges nothing to count")
	case c.Shadow:
		return fmt.Errorf("count: a shadow rule cannot count by outcome")
	}
	for _, l := range c.Limits {
		if err := refundable(l); err != nil {
			return err
		}
	}
	return nil
}

// refundable reports whether the charges of l can be given back: a
// sliding window, fixed window or token bucket, not elastic.

func refundable(l Limit) error {
	if l.Ceiling > 0 {
		return fmt.Errorf("count: limit %s: an elastic limit (ceiling) cannot count by outcome", l)
	}
	switch l.Algorithm {
	case SlidingWindow, FixedWindow, TokenBucket:
		return nil
	}
	return fmt.Errorf("count: limit %s: counting by outcome needs a sliding_window, fixed_window or token_bucket limit, whose charges can be given back", l)
}

// settlementFor returns what an admitted request owes the counting rules
// among its charges, or nil if it owes nothing. store is the store that
// admitted the charges at at.
func (l *Limiter) settlementFor(cr countingRules, store Store, at time.Time, charges []Charge) *settlement {
	if store == nil {
		store = l.cfg.store
	}
	var s *settlement
	for i := range charges {
		c, ok := cr[charges[i].Name]
		if !ok || charges[i].Cost == 0 {
			continue
		}
		if s == nil {
			rf, ok := store.(Refunder)
			if !ok {
				return nil
			}
			s = &settlement{l: l, store: rf, at: at}
		}
		s.charges = append(s.charges, charges[i])
		s.counts = append(s.counts, c)
	}
	return s
}

// serveCounted serves an admitted request whose response decides what it
// is charged: next writes through a statusRecorder, and res is finished
// with the status the client got, or as a panic.
func (l *Limiter) serveCounted(w http.ResponseWriter, r *http.Request, next http.Handler, res *Result) {
	rec := newStatusRecorder(w)
	status := 0 // a panic
	defer func() { res.Finish(status) }()
	next.ServeHTTP(rec, r)
	status = rec.Status()
}

// storeTake asks store to decide charges at now, with TakeAt when at is
// not nil (see take).
func (l *Limiter) storeTake(store Store, ctx context.Context, now time.Time, charges []Charge, out []Decision, at *time.Time) (bool, error) {
	if at == nil && store == l.cfg.store {
		if fs := l.syncs.store.Load(); fs != nil {
			// Rules in lease or write-back mode (sync.go).
			return fs.Take(ctx, now, internalCharges(charges), internalDecisions(out))
		}
	}
	if at == nil {
		return store.Take(ctx, now, charges, out)
	}
	rf, ok := store.(Refunder)
	if !ok {
		return store.Take(ctx, now, charges, out)
	}
	allowed, when, err := rf.TakeAt(ctx, now, charges, out)
	if err == nil && allowed {
		*at = when
	}
	return allowed, err
}

// checkRefunder reports an error if set has rules that count by outcome
// and the store cannot give charges back.
func (l *Limiter) checkRefunder(set *ruleSet) error {
	for _, r := range set.rules {
		if r.Count.IsZero() {
			continue
		}
		if _, ok := l.cfg.store.(Refunder); !ok {
			return fmt.Errorf("sluice: rule %q: count needs a store that can give charges back (a Refunder, such as the memory and Redis stores); %T cannot", r.Name, l.cfg.store)
		}
	}
	return nil
}
