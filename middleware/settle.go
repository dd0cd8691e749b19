package middleware

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/fleetstore"
	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/usage"
	"github.com/sluicehq/sluice/keyfunc"
)

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

// settleFrom is Result.SettleFrom.
func (s *settlement) settleFrom(h ResponseHeader) error {
	if s.header == "" {
		return nil
	}
	v := h.Get(s.header)
	if v != "" {
		h.Del(s.header)
	} else if v = h.Get(http.TrailerPrefix + s.header); v != "" {
		h.Del(http.TrailerPrefix + s.header)
	} else {
		return nil
	}
	units, err := usage.ParseUnits(v)
	if err == nil {
		err = s.settleUnits(units)
	}
	if err != nil {
		err = fmt.Errorf("sluice: rule %q: usage header %s: %w", s.lines[0].rule, s.header, err)
		s.l.cfg.report(nil, err)
	}
	return err
}

// usageSuffix separates a rule's name from its usage unit in the Name of
// the usage limits' counters: "~" is a character no rule name has, so
// that no rule's counters can be another's, and the word keeps them apart
// from an elastic limit's headroom ("~elastic").
const usageSuffix = "~usage~"

// usageCharge reports whether c is a charge of a usage limit.
func usageCharge(c *Charge) bool { return strings.Contains(c.Name, usageSuffix) }

// anyUsage reports whether a charge is of a usage limit: their denials are
// never remembered by the deny cache, since a usage limit whose estimate
// does not fit still admits while its budget is not spent (retryUsage).
func anyUsage(charges []Charge) bool {
	for i := range charges {
		if usageCharge(&charges[i]) {
			return true
		}
	}
	return false
}

// estimate is what a request of the rule is charged on its usage limits
// when admitted: the estimate, between 1 and Max.
func (u *compiledUsage) estimate(r keyfunc.Request) int {
	e := u.Estimate
	if u.EstimateFunc != nil {
		e = u.EstimateFunc(r)
	}
	return min(max(e, 1), u.max)
}

// addUsage appends the usage charges of rule for r, whose key is key, to
// s.
func (s *scratch) addUsage(u *compiledUsage, key string, r keyfunc.Request, top *hitters.Gates) {
	e := u.estimate(r)
	for i, lim := range u.Limits {
		s.charges = append(s.charges, Charge{Key: key, Name: u.name, Limit: lim, Cost: e})
		s.metas = append(s.metas, chargeMeta{name: u.names[i], nominal: &u.Limits[i], policy: u.policy, prepared: u.prepared[i], usage: u, estimate: e, top: top})
	}
	s.usage = true
}

// retryUsage decides again a request that only its usage limits denied,
// each with at least one unit left: the client's budget is not spent, so
// the request is admitted on one unit of each, the rest of its usage to
// be settled when it ends. It reports whether the request was admitted;
// if so, s.charges and s.decisions are those of the second call, which
// charged the usage limits 1. If not (a concurrent request spent the
// budget, or the store failed), the first decisions stand.
func (l *Limiter) retryUsage(ctx context.Context, now time.Time, s *scratch) bool {
	tried := false
	for i := range s.decisions {
		if s.decisions[i].Allowed {
			continue
		}
		if s.metas[i].usage == nil || s.decisions[i].Remaining < 1 {
			return false
		}
		tried = true
	}
	if !tried {
		return false
	}
	s.usageAlt = append(s.usageAlt[:0], s.charges...)
	for i := range s.decisions {
		if !s.decisions[i].Allowed {
			s.usageAlt[i].Cost = 1
		}
	}
	s.usageDec = grow(s.usageDec, len(s.usageAlt))
	ok, err := l.takeAt(ctx, now, s.fleet, s.usageAlt, s.usageDec, s.atp)
	if err != nil {
		l.cfg.report(nil, err)
		return false
	}
	if ok {
		copy(s.charges, s.usageAlt)
		copy(s.decisions, s.usageDec)
	}
	return ok
}

// settleThroughFleet makes the usage of a request decided by the
// coordination layer (rules in lease or write-back mode) settle through
// it: at the instant it was decided on this server's clock, for what is
// given back, and with the layer as its store, which charges the
// write-back counters' views (pushed with their other counts), the lease
// counters' slices, and the exact store for the rest. A request the local
// fallback decided (FailLocal) settles with the fallback.
func (l *Limiter) settleThroughFleet(fs *fleetstore.Store, now time.Time, s *scratch) {
	if now.IsZero() {
		now = time.Now()
	}
	s.at = now
	if s.store == nil {
		s.store = fleetSettler{fs}
	}
}

// fleetSettler settles through the coordination layer; see
// settleThroughFleet.
type fleetSettler struct{ fs *fleetstore.Store }

func (f fleetSettler) Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return f.fs.Take(ctx, now, internalCharges(charges), internalDecisions(out))
}

func (f fleetSettler) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	ok, err := f.Take(ctx, now, charges, out)
	if now.IsZero() {
		now = time.Now()
	}
	return ok, now, err
}

func (f fleetSettler) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return f.fs.Refund(ctx, at, internalCharges(charges))
}

func (f fleetSettler) Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error {
	return f.fs.Settle(ctx, now, internalCharges(charges), internalDecisions(out))
}

// checkSettler reports an error if set has rules with usage limits and
// the store cannot settle them.
func (l *Limiter) checkSettler(set *ruleSet) error {
	for _, r := range set.rules {
		if r.usage == nil {
			continue
		}
		if _, ok := l.cfg.store.(Settler); !ok {
			return fmt.Errorf("sluice: rule %q: usage needs a store that can settle costs after the fact (a Settler, such as the memory and Redis stores); %T cannot", r.Name, l.cfg.store)
		}
	}
	return nil
}
