package fleetstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

// ExactSettler is the exact store's settle and refund (the Redis store's),
// which Settle and Refund use for the charges of rules decided exactly, and
// in lease mode for what a slice does not cover.
type ExactSettler interface {
	Settle(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) error
	Refund(ctx context.Context, at time.Time, charges []window.Charge) error
}

// Settle charges the costs of charges whatever fits (window.Settle): the
// usage of admitted requests, settled once they have run, through the
// local count. In write-back mode the cost is added to the counter's view
// and to what is unsynced, which the syncer pushes as any count (at once,
// and waited for, when that brings the counter to max_unsynced): a settle
// costs no call of its own. In lease mode it is taken from the slice the
// server holds, and what the slice does not cover is charged to the shared
// store with its own settle, as the charges of rules decided exactly are.
// The decisions describe the counters after the charge as this server
// sees them.
func (s *Store) Settle(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) error {
	ex, ok := s.cfg.Exact.(ExactSettler)
	if !ok {
		return errors.New("fleetstore: the exact store cannot settle")
	}
	if len(out) != len(charges) {
		return fmt.Errorf("fleetstore: %d decisions for %d charges", len(out), len(charges))
	}
	rules := *s.rules.Load()
	bs := make([]*binding, len(charges))
	for i := range charges {
		c := &charges[i]
		if err := c.Limit.Validate(); err != nil {
			return fmt.Errorf("fleetstore: charge %d: %w", i, err)
		}
		if c.Cost < 0 {
			return fmt.Errorf("fleetstore: charge %d: negative cost %d", i, c.Cost)
		}
		if !c.Exact() {
			// (A charge to decide exactly settles in the shared store,
			// even one that spent a slice's last units: the store counts
			// the same either way.)
			bs[i] = s.bind(rules, c, nil)
		}
	}
	ms, call := s.instant(now)
	var rest []window.Charge
	var idx []int
	for i := range charges {
		c, b := &charges[i], bs[i]
		switch {
		case b == nil:
			rest, idx = append(rest, *c), append(idx, i)
		case b.set.Mode == fleet.Lease:
			if left := s.settleLease(c, b, ms, &out[i]); left > 0 {
				r := *c
				r.Cost = int(left)
				rest, idx = append(rest, r), append(idx, i)
			}
		default:
			s.settleWriteBack(ctx, c, b, ms, call, &out[i])
		}
	}
	if len(rest) == 0 {
		return nil
	}
	ds := make([]window.Decision, len(rest))
	if err := ex.Settle(ctx, now, rest, ds); err != nil {
		return err
	}
	for k, i := range idx {
		out[i] = ds[k]
	}
	return nil
}

// settleWriteBack adds the cost of c to the view of its counter, whatever
// fits, as unsynced units.
func (s *Store) settleWriteBack(ctx context.Context, c *window.Charge, b *binding, ms, call int64, out *window.Decision) {
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	l := &b.lim
	sh.mu.Lock()
	e := s.entryFor(sh, id, c, b, ms)
	var w waits
	e = s.awaitRoom(ctx, &w, sh, id, c, b, e, ms, cost)
	v := e.view()
	at := v.Roll(l, ms)
	window.Settle(&v.C, at, *l, cost)
	v.U.Curr += cost
	e.setView(&v)
	e.used = ms
	if cost > 0 {
		sh.enlist(id, e)
		// Unsynced units the others have not seen, as an admission's
		// (fleet.Blind's M).
		bl := e.blind()
		bl.Note(l, ms, v.C.Start, v.Unsynced()+e.inflight)
		e.setBlind(bl)
	}
	claimed := cost > 0 && s.claimPush(e, b, ms)
	sh.mu.Unlock()
	*out = window.Describe(v.C, at, *l, cost, true)
	if cost > 0 {
		if fn := s.cfg.Events.Unsynced; fn != nil {
			fn(b.name, cost)
		}
	}
	if claimed {
		s.pushClaimed(ctx, &w, sh, id, call, ms)
	}
	w.stop()
}

// settleLease takes the cost of c from the slice its counter holds, and
// returns what the slice does not cover, for the shared store.
func (s *Store) settleLease(c *window.Charge, b *binding, ms int64, out *window.Decision) (left int64) {
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	sh.mu.Lock()
	e := s.entryFor(sh, id, c, b, ms)
	var take int64
	if e.up > ms {
		take = min(e.uc, cost)
		e.uc -= take
	}
	e.used = ms
	st, at := b.lim.Roll(e.state(), ms)
	e.setState(st)
	sh.mu.Unlock()
	*out = window.Describe(st, at, b.lim, cost, true)
	return cost - take
}

// Refund gives back the costs of charges admitted at at: of rules in a
// fleet mode, in process (back to the slice in lease mode; off the view and
// what is unsynced in write-back mode, units already pushed staying
// counted, which errs on the side of denying); of the others, with the
// exact store's refund.
func (s *Store) Refund(ctx context.Context, at time.Time, charges []window.Charge) error {
	ex, ok := s.cfg.Exact.(ExactSettler)
	if !ok {
		return errors.New("fleetstore: the exact store cannot refund")
	}
	rules := *s.rules.Load()
	var rest []window.Charge
	for i := range charges {
		c := &charges[i]
		if c.Cost < 0 {
			return fmt.Errorf("fleetstore: charge %d: negative cost %d", i, c.Cost)
		}
		if b := s.bind(rules, c, nil); b != nil && !c.Exact() {
			s.giveBack(c, b)
		} else {
			rest = append(rest, *c)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	return ex.Refund(ctx, at, rest)
}
