package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/regions"
)

// TakeAt is Take that also returns the instant it decided at: the one the
// Redis that decided read (the region's own, or the home region's for
// ScopeGlobalStrict charges alone), so that Refund takes the charges off
// the windows they were counted in whatever this server's clock says; now
// or RegionConfig.Now when one was given. See Refunder.
func (s *RegionStore) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	ok, at, err := s.take(ctx, now, charges, out)
	switch {
	case at != 0:
		return ok, time.UnixMilli(at), err
	case !now.IsZero():
		return ok, now, err
	case s.fake:
		return ok, s.cfg.Now(), err
	}
	return ok, time.Time{}, err
}

// Refund gives back charges admitted at at: those of ScopeGlobal rules off
// the region's own count of the window that held at (peers that saw the
// larger count keep it: they count more, never less), the others with the
// region's (or, for ScopeGlobalStrict, the home region's) store; see
// Refunder.
func (s *RegionStore) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return s.split(charges, func(_ int, c *Charge, sc scopeSet) error {
		rc, err := s.global(c, sc)
		if err != nil {
			return err
		}
		ms := at.UnixMilli()
		return s.g.Refund(ctx, rc, regions.Decision{Start: ms - ms%rc.Window})
	}, func(st *RedisStore, cs []Charge, _ []int) error { return st.Refund(ctx, at, cs) })
}

// Settle charges costs whatever fits, a charge that cannot be refused:
// those of ScopeGlobal rules to the region's own count (synced to the
// peers as any count), the others with the region's (or, for
// ScopeGlobalStrict, the home region's) store; see Settler.
func (s *RegionStore) Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error {
	ms := s.at(now)
	return s.split(charges, func(i int, c *Charge, sc scopeSet) error {
		rc, err := s.global(c, sc)
		if err != nil {
			return err
		}
		d, err := s.g.Settle(ctx, ms, rc)
		if err != nil {
			return err
		}
		out[i] = globalDecision(rc, d, d.Now)
		out[i].Allowed = true
		return nil
	}, func(st *RedisStore, cs []Charge, idx []int) error {
		sub := make([]Decision, len(cs))
		err := st.Settle(ctx, now, cs, sub)
		for j, i := range idx {
			out[i] = sub[j]
		}
		return err
	})
}

// split calls global for each charge of a ScopeGlobal rule (with its
// index), and regional
// with the charges of the others (and their indexes in charges), grouped
// by the store that keeps them.
func (s *RegionStore) split(charges []Charge, global func(i int, c *Charge, sc scopeSet) error, regional func(st *RedisStore, cs []Charge, idx []int) error) error {
	scopes := s.scopesNow()
	var local, strict []Charge
	var li, si []int
	var errs []error
	for i := range charges {
		c := &charges[i]
		switch sc := scopes[c.Name]; sc.scope {
		case ScopeGlobal:
			errs = append(errs, global(i, c, sc))
		case ScopeGlobalStrict:
			strict, si = append(strict, *c), append(si, i)
		default:
			local, li = append(local, *c), append(li, i)
		}
	}
	if len(local) > 0 {
		errs = append(errs, regional(s.local, local, li))
	}
	if len(strict) > 0 {
		errs = append(errs, regional(s.home, strict, si))
	}
	return errors.Join(errs...)
}
