package middleware

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/usage"
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

// Settler is implemented by stores that can settle costs after the fact:
// the memory and Redis stores, and RegionStore. Rules with usage limits
// (Rule.Usage) need one: their requests are charged an estimate when
// admitted, and the difference with what they used once they have run.
type Settler interface {
	Refunder
	// Settle charges the costs of charges at now whether they fit or not,
	// a charge that cannot be refused: a counter it takes past its limit
	// is in debt, which the client waits off. It writes one Decision per
	// charge into out, describing the counter after the charge as a read
	// would find it (Debt, Remaining, and NextAfter: when one unit fits
	// again). The zero now means the store's clock.
	Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error
}

// settlement is what an admitted request owes the rules that count by
// outcome (their charges, given back by Finish if the status does not
// count) and its usage limits (the difference between what it used and
// its estimate, settled by Finish).
type settlement struct {
	l       *Limiter
	store   Refunder
	at      time.Time
	charges []Charge
	counts  []*Count
	once    sync.Once
	// ledger is the account of the usage limits, nil if none; lines are
	// their charges, one per line of the ledger; header is the response
	// header that may report the usage.
	ledger *usage.Ledger
	lines  []usageLine
	header string
	// ctx is the request's context, for the Observers' SettleEvents.
	ctx context.Context
}

// usageLine is one usage limit an admitted request was charged on.
type usageLine struct {
	charge Charge // Cost is unused
	policy string
	rule   string
}

// Finish ends a request: it gives back the request's concurrency slots
// (as Done does); for rules that count by outcome (Rule.Count), it gives
// back the request's charges if the response's status does not count; and
// for usage limits (Rule.Usage), it charges the difference between what
// the request used (Settle) and what it was charged when admitted, or
// gives it back.
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
	if s.ledger != nil {
		s.apply(s.ledger.Close())
	}
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

// settleUnits records the usage of the request, and applies it at once if
// the request has ended.
func (s *settlement) settleUnits(units int64) error {
	due, err := s.ledger.Settle(units)
	if err != nil {
		return err
	}
	if due != nil {
		s.apply(due)
	}
	return nil
}

// apply charges what is due on each usage line, whatever fits (Settle),
// or gives it back (Refund, off the charge made when the request was
// admitted), and tells the Observers.
func (s *settlement) apply(due []int64) {
	var more, back []Charge
	var moreIdx []int
	for i, d := range due {
		c := s.lines[i].charge
		switch {
		case d > 0:
			c.Cost = int(d)
			more, moreIdx = append(more, c), append(moreIdx, i)
		case d < 0:
			c.Cost = int(-d)
			back = append(back, c)
		}
	}
	o := s.l.cfg.obs
	ctx := context.Background() // the stores bound their own calls
	if len(more) > 0 {
		var now time.Time
		if s.l.cfg.clock != nil {
			now = s.l.cfg.clock()
		}
		out := make([]Decision, len(more))
		err := s.store.(Settler).Settle(ctx, now, more, out)
		if err != nil {
			err = fmt.Errorf("%w: settle the usage of rule %q: %w", ErrStore, s.lines[moreIdx[0]].rule, err)
			s.l.cfg.report(nil, err)
		}
		if o != nil {
			for k, i := range moreIdx {
				ln := &s.lines[i]
				e := SettleEvent{Rule: ln.rule, Policy: ln.policy, Units: int(s.ledger.Used(i)), Charged: more[k].Cost, Err: err, Context: s.ctx}
				if err == nil {
					e.Debt = out[k].Debt
				}
				o.Settled(e)
			}
		}
	}
	if len(back) > 0 {
		err := s.store.Refund(ctx, s.at, back)
		if err != nil {
			err = fmt.Errorf("%w: give back unused usage of rule %q: %w", ErrStore, s.lines[0].rule, err)
			s.l.cfg.report(nil, err)
		}
		if o != nil {
			for i, d := range due {
				if d < 0 {
					o.Settled(SettleEvent{Rule: s.lines[i].rule, Policy: s.lines[i].policy, Units: int(s.ledger.Used(i)), Charged: int(d), Err: err, Context: s.ctx})
				}
			}
		}
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
// and the usage limits among its charges, or nil if it owes nothing.
// store is the store that admitted the charges at at.
func (l *Limiter) settlementFor(cr countingRules, store Store, at time.Time, charges []Charge, metas []chargeMeta) *settlement {
	if store == nil {
		store = l.cfg.store
	}
	var s *settlement
	var lines []usage.Line
	for i := range charges {
		c, ok := cr[charges[i].Name]
		u := metas[i].usage
		if !ok && u == nil || charges[i].Cost == 0 {
			continue
		}
		if s == nil {
			rf, ok := store.(Refunder)
			if !ok {
				return nil
			}
			s = &settlement{l: l, store: rf, at: at}
		}
		if u == nil {
			s.charges = append(s.charges, charges[i])
			s.counts = append(s.counts, c)
			continue
		}
		if _, ok := store.(Settler); !ok {
			continue
		}
		lines = append(lines, usage.Line{Estimate: int64(metas[i].estimate), Paid: int64(charges[i].Cost), Max: int64(u.max), Rule: u.rule})
		s.lines = append(s.lines, usageLine{charge: charges[i], policy: metas[i].name, rule: u.rule})
		if s.header == "" {
			s.header = u.Header
		}
	}
	if lines != nil {
		s.ledger = usage.NewLedger(lines)
	}
	return s
}

// serveCounted serves an admitted request whose response decides what it
// is charged: next writes through a statusRecorder, which settles the
// usage its rule's header reports before the header is sent, with a
// context through which Settle reaches the request's usage; and res is
// finished with the status the client got, or as a panic, once a trailer
// of the usage header is read.
func (l *Limiter) serveCounted(w http.ResponseWriter, r *http.Request, next http.Handler, res *Result) {
	rec := newStatusRecorder(w)
	status := 0 // a panic
	s := res.settle
	defer func() {
		if s.header != "" {
			_ = s.settleFrom(w.Header())
		}
		res.Finish(status)
	}()
	if s.ledger != nil {
		if s.header != "" {
			rec.settle = s
		}
		r = r.WithContext(context.WithValue(r.Context(), settleKey, s))
	}
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
