package redisstore

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Settle charges the costs of charges at now whether they fit or not, as
// window.SettleAll does: the usage of admitted requests, settled once they
// have run. It runs decide.lua in its settle mode through the same
// batches as Take, one round trip (one per Key on a client that shards by
// key), and a counter it takes past its limit is in debt: the decisions
// written to out describe the counters after the charge as a read would
// find them, with Decision.Debt. The zero now means the server's clock. A
// non-nil error means the settle may not have been counted (a run that
// answered after the deadline was, which errs on the side of counting).
func (s *Store) Settle(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) error {
	_, _, err := s.decideBounded(ctx, now, charges, out, true)
	return err
}

// settleSplit settles charges of several Keys on a client that shards by
// key: one run per Key, all at the instant of the first. A run that fails
// leaves the earlier ones counted.
func (s *Store) settleSplit(ctx context.Context, sc *scratch, nowMs int64, charges []window.Charge, out []window.Decision) (bool, int64, error) {
	sc.order = sc.order[:0]
	for i := range charges {
		if i > 0 && sameKeyBefore(charges, i) {
			continue
		}
		start := len(sc.order)
		for j := i; j < len(charges); j++ {
			if charges[j].Key == charges[i].Key {
				sc.order = append(sc.order, j)
			}
		}
		group := sc.order[start:]
		_, ms, err := s.run(ctx, sc, nowMs, true, charges, group, out)
		if err != nil {
			return false, 0, err
		}
		nowMs = ms
	}
	return true, nowMs, nil
}

// sameKeyBefore reports whether a charge before i has the Key of charge i.
func sameKeyBefore(charges []window.Charge, i int) bool {
	for j := range i {
		if charges[j].Key == charges[i].Key {
			return true
		}
	}
	return false
}
