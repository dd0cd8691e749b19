package memstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// TakeAt is Take that also returns the instant the charges were decided
// at: now, or the Store's clock when now is the zero time. Refund takes
// charges back at that instant.
func (s *Store) TakeAt(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, time.Time, error) {
	if now.IsZero() {
		now = s.now()
	}
	ok, err := s.Take(ctx, now, charges, out)
	return ok, now, err
}

// Refund takes back the costs of charges admitted at at (see TakeAt), as
// window.Refund describes: off a sliding window's count of the window
// that holds at, a fixed window's count if it is still that window, a
// token bucket's level, a sliding log's entry of the instant at. Counters
// that no longer exist or have expired are
// left alone, and none is created. It returns an error, and takes nothing
// back, if a charge has an invalid Limit, a negative Cost or an algorithm
// that cannot be refunded (window.Refundable), or if ctx is done.
func (s *Store) Refund(ctx context.Context, at time.Time, charges []window.Charge) error {
	for i := range charges {
		c := &charges[i]
		if err := checkCharge(i, c); err != nil {
			return err
		}
		if !window.Refundable(c.Limit) {
			return fmt.Errorf("memstore: charge %d (%q): a %s cannot be refunded", i, c.Name, c.Limit.Algorithm)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	ms := at.UnixMilli()
	for i := range charges {
		c := &charges[i]
		if c.Cost == 0 {
			continue
		}
		k1, k2 := s.keyHash(c.Key)
		id, sh := s.ident(k1, k2, c.Name, series(&c.Limit)), &s.shards[s.shardOf(k2)]
		sh.mu.Lock()
		if r := sh.lookup(id); r >= 0 {
			st, exp := sh.state(r, c.Limit.Algorithm)
			// A counter that expired is taken as absent whether it is
			// refunded or not; one the charge itself wrote expires later
			// than the charge.
			if ms < exp && window.Refund(&st, c.Limit, ms, int64(c.Cost)) {
				sh.set(r, &st, min(exp, max(until(&c.Limit, &st, ms), ms+1)), &c.Limit)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}
