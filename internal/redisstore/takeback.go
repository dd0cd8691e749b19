package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/window"
)

var (
	//go:embed takeback.lua
	takeBackSrc    string
	takeBackScript = keyguard.Script(takeBackSrc)
)

// TakeAt is Take that also returns the instant the script decided at (the
// server's clock, TIME, when now is the zero time), which Refund needs.
// With an error, the instant means nothing.
func (s *Store) TakeAt(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, time.Time, error) {
	allowed, ms, err := s.decideBounded(ctx, now, charges, out, false)
	if err != nil && ms == 0 {
		return false, time.Time{}, err
	}
	return allowed, time.UnixMilli(ms), err
}

// decideBounded is decide, for a client of unknown type that may not
// honour a context's deadline (detach) run on a goroutine of its own and
// waited for only until the deadline.
func (s *Store) decideBounded(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision, settle bool) (bool, int64, error) {
	if !s.detach {
		return s.decide(ctx, now, charges, out, settle)
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if ctx.Done() == nil { // no deadline to keep
		return s.decide(ctx, now, charges, out, settle)
	}
	// The goroutine may outlive this call, so it gets copies: the caller
	// may reuse charges, their Keys and out once it returns.
	call := &detachedCall{
		charges: make([]window.Charge, len(charges)),
		out:     make([]window.Decision, len(out)),
		done:    make(chan struct{}),
	}
	for i, c := range charges {
		c.Key = strings.Clone(c.Key)
		call.charges[i] = c
	}
	go func() {
		defer close(call.done)
		call.allowed, call.ms, call.err = s.decide(ctx, now, call.charges, call.out, settle)
	}()
	select {
	case <-call.done:
		copy(out, call.out)
		return call.allowed, call.ms, call.err
	case <-ctx.Done():
		return false, 0, fmt.Errorf("redisstore: no answer in time: %w", ctx.Err())
	}
}

// Refund takes back the costs of charges admitted at at (see TakeAt) with
// the script takeback.lua, the twin of window.Refund: off a sliding
// window's count of the window that holds at, a fixed window's count if it
// is still that window, a token bucket's level, a sliding log's entry of
// the instant at. One run per Key (a run
// touches one Redis Cluster slot). It returns an error, and takes nothing
// back, if a charge has an invalid Limit, a negative Cost or an algorithm
// that cannot be refunded (window.Refundable); a run that fails leaves its
// costs counted, which errs on the side of denying.
func (s *Store) Refund(ctx context.Context, at time.Time, charges []window.Charge) error {
	for i := range charges {
		c := &charges[i]
		if err := checkCharge(i, c); err != nil {
			return err
		}
		if !window.Refundable(c.Limit) {
			return fmt.Errorf("redisstore: charge %d (%q): a %s cannot be refunded", i, c.Name, c.Limit.Algorithm)
		}
	}
	nowMs := at.UnixMilli()
	if at.IsZero() || nowMs < 0 || nowMs > maxNow {
		return fmt.Errorf("redisstore: refund at %s: want the instant TakeAt returned", at)
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	var errs []error
	for start := 0; start < len(charges); {
		end := start + 1
		if s.split {
			for end < len(charges) && charges[end].Key == charges[start].Key {
				end++
			}
		} else {
			end = len(charges)
		}
		var keys []string
		args := []any{nowMs}
		var bucket string
		for i := start; i < end; i++ {
			c := &charges[i]
			if c.Cost == 0 {
				continue
			}
			if i == start || c.Key != charges[i-1].Key {
				bucket = string(s.appendKey(nil, c.Key))
			}
			keys = append(keys, bucket)
			field := string(appendField(nil, c))
			l := &c.Limit
			switch {
			case l.Algorithm == window.SlidingWindow:
				args = append(args, field, codeSliding, int64(c.Cost), l.Window.Milliseconds())
			case l.Algorithm == window.TokenBucket:
				args = append(args, field, codeToken, int64(c.Cost), l.Window.Milliseconds())
			case l.Algorithm == window.SlidingLog:
				args = append(args, field, codeLog, int64(c.Cost), l.Window.Milliseconds())
			default: // a fixed window: the start of the window charged
				ws, _ := l.Bounds(nowMs)
				args = append(args, field, codeFixed, int64(c.Cost), ws)
			}
		}
		if len(keys) > 0 {
			if _, err := s.eval(ctx, takeBackScript, keys, args); err != nil {
				errs = append(errs, fmt.Errorf("redisstore: take back: %w", err))
			}
		}
		start = end
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}
