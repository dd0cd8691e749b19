package middleware

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
)

// hold is the concurrency slots a request holds, given back by
// Result.Done.
type hold struct {
	l     *Limiter
	slots []heldSlot
	once  sync.Once
	ov    *overloadHold // places under the capacity signals (adaptive.go)
}

type heldSlot struct {
	store SlotStore
	slot  Slot
}

// slotRequest is a concurrency limit a request must get a slot of.
type slotRequest struct {
	rule   *compiledRule
	key    string
	shadow bool
}

func (h *hold) release() {
	h.once.Do(func() {
		h.releaseOverload()
		h.l.untrack(h)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for i := range h.slots {
			if err := h.slots[i].store.Release(ctx, &h.slots[i].slot); err != nil {
				h.l.cfg.report(nil, fmt.Errorf("%w: release concurrency slot of rule %q: %w", ErrStore, h.slots[i].slot.Name, err))
			}
		}
	})
}

// newSlotID returns a random ID for a slot.
func newSlotID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// acquire takes a slot of every concurrency limit in reqs, all or nothing.
// It returns the hold (nil if none was taken) and, when an enforced limit
// had no free slot, the denial.
func (l *Limiter) acquire(ctx context.Context, now time.Time, r keyfunc.Request, reqs []slotRequest) (h *hold, denied *Result, shadowed bool, err error) {
	store := l.cfg.slots
	for _, q := range reqs {
		s := Slot{Key: q.key, Name: q.rule.Name, Limit: q.rule.Concurrency, ID: newSlotID(), Lease: l.cfg.lease}
		ok, held, aerr := store.Acquire(ctx, now, &s)
		if aerr != nil && l.cfg.failure == FailLocal && l.cfg.fallbackSlots != nil {
			l.cfg.report(r, fmt.Errorf("%w: concurrency slot of rule %q: %w", ErrStore, q.rule.Name, aerr))
			ok, held, aerr = l.cfg.fallbackSlots.Acquire(ctx, now, &s)
			if aerr == nil {
				store = l.cfg.fallbackSlots
			}
		}
		if aerr != nil {
			if l.cfg.failure == FailClosed {
				h.releaseNow()
				return nil, nil, false, fmt.Errorf("%w: concurrency slot of rule %q: %w", ErrStore, q.rule.Name, aerr)
			}
			l.cfg.report(r, fmt.Errorf("%w: concurrency slot of rule %q: %w", ErrStore, q.rule.Name, aerr))
			continue // fail open: no slot, no limit
		}
		if !ok {
			if q.shadow || l.cfg.shadow {
				shadowed = true
				continue
			}
			h.releaseNow()
			return nil, &Result{
				Applied: true, Policy: q.rule.Name, Limit: Limit{Requests: q.rule.Concurrency},
				Remaining: 0, RetryAfter: ConcurrencyRetryAfter, NextAfter: ConcurrencyRetryAfter,
				Concurrency: true, InFlight: held, status: q.rule.ConcurrencyStatus,
				Rule: q.rule.Name, key: q.key, top: q.rule.top,
			}, shadowed, nil
		}
		if h == nil {
			h = &hold{l: l}
		}
		h.slots = append(h.slots, heldSlot{store: store, slot: s})
		store = l.cfg.slots
	}
	if h != nil {
		l.track(h)
	}
	return h, nil, shadowed, nil
}

// releaseNow gives back the slots of a hold that never reached a Result.
func (h *hold) releaseNow() {
	if h != nil {
		h.release()
	}
}

// renewer keeps the leases of the slots of requests in flight.
type renewer struct {
	mu     sync.Mutex
	active map[*hold]struct{}
	stop   chan struct{}
	done   chan struct{}
	closed bool // by Limiter.Close: no renewal starts again
}

func (l *Limiter) track(h *hold) {
	r := &l.renew
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active == nil {
		r.active = make(map[*hold]struct{})
	}
	r.active[h] = struct{}{}
	if r.stop == nil && l.cfg.slotsShared && !r.closed {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go l.renewLoop(r.stop, r.done)
	}
}

func (l *Limiter) untrack(h *hold) {
	r := &l.renew
	r.mu.Lock()
	delete(r.active, h)
	r.mu.Unlock()
}

// renewLoop renews the leases of every slot held, every third of the
// lease, until stop is closed.
func (l *Limiter) renewLoop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(l.cfg.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			l.renewAll()
		}
	}
}

// renewAll renews the lease of every slot held, per store.
func (l *Limiter) renewAll() {
	r := &l.renew
	r.mu.Lock()
	byStore := map[SlotStore][]*Slot{}
	for h := range r.active {
		for i := range h.slots {
			hs := &h.slots[i]
			byStore[hs.store] = append(byStore[hs.store], &hs.slot)
		}
	}
	r.mu.Unlock()
	var now time.Time
	if l.cfg.clock != nil {
		now = l.cfg.clock()
	}
	for store, slots := range byStore {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.lease/3)
		if err := store.Renew(ctx, now, slots); err != nil {
			l.cfg.report(nil, fmt.Errorf("%w: renew concurrency slots: %w", ErrStore, err))
		}
		cancel()
	}
}

// stopRenewer stops the renewal of leases for good; slots still held, and
// slots taken later, then expire after their lease.
func (l *Limiter) stopRenewer() {
	r := &l.renew
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.stop, r.closed = nil, true
	r.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// wait holds an admitted request until its turn in a leaky bucket's queue
// (res.Delay). If the client goes away first, or too many requests wait
// already, the request's places are given back.
func (l *Limiter) wait(ctx context.Context, now time.Time, r keyfunc.Request, s *scratch, res *Result) error {
	if n := l.waiting.Add(1); n > l.cfg.maxWaiting {
		l.waiting.Add(-1)
		l.giveBack(now, r, s, res)
		res.Allowed, res.RetryAfter, res.NextAfter = false, res.Delay, res.Delay
		res.Remaining = 0
		return nil
	}
	defer l.waiting.Add(-1)
	t := time.NewTimer(res.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		l.giveBack(now, r, s, res)
		return fmt.Errorf("%w: %w", ErrGaveUp, context.Cause(ctx))
	}
}

// giveBack returns the places of the request's charges that waited.
func (l *Limiter) giveBack(now time.Time, r keyfunc.Request, s *scratch, res *Result) {
	store := l.cfg.store
	if res.Outcome == OutcomeFallback {
		store = l.cfg.fallback // the store that gave the turn
	}
	ret, ok := store.(Returner)
	if !ok {
		return
	}
	var back []Charge
	for i := range s.charges {
		if s.decisions[i].Delay > 0 {
			back = append(back, s.charges[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := ret.GiveBack(ctx, now, back); err != nil {
		l.cfg.report(r, fmt.Errorf("%w: give back a place in the queue: %w", ErrStore, err))
	}
}
