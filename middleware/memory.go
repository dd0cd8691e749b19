package middleware

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/memstore"
	"github.com/sluicehq/sluice/internal/slots"
	"github.com/sluicehq/sluice/internal/window"
)

// MemoryConfig configures NewMemoryStore. The zero value is ready to use.
type MemoryConfig struct {
	// MaxKeys bounds the number of counters kept; when it is reached, an
	// old counter is evicted: the least recently used of a small random
	// sample, expired ones first. 0 means 1<<20 (about one million
	// counters, about 50 MB). Evicting a counter forgets that client's
	// recent requests, so size it above the number of clients active in a
	// window.
	MaxKeys int
	// Shards is the number of independently locked parts; 0 picks a
	// default. More shards mean less lock contention across cores.
	Shards int
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
	// SweepInterval is how often one background goroutine reclaims
	// expired counters; 0 means one minute, negative disables it (expired
	// counters are then reclaimed only as new keys arrive).
	SweepInterval time.Duration
}

// MemoryStore counts in this process's memory. It is a Store, and also a
// SlotStore, a Returner, a Resetter, a TraitsReporter and a
// MemoryReporter. Make one with NewMemoryStore. It is safe for concurrent
// use.
type MemoryStore struct {
	s     *memstore.Store
	slots *slots.Table
}

// The interfaces a MemoryStore implements.
var (
	_ Store          = (*MemoryStore)(nil)
	_ SlotStore      = (*MemoryStore)(nil)
	_ Returner       = (*MemoryStore)(nil)
	_ Resetter       = (*MemoryStore)(nil)
	_ TraitsReporter = (*MemoryStore)(nil)
	_ MemoryReporter = (*MemoryStore)(nil)
)

// NewMemoryStore returns a store that counts in this process's memory:
// exact, sharded, bounded by MaxKeys. It suits a single process, tests and
// development; app servers behind a load balancer need a shared store such
// as NewRedisStore.
//
// Unless cfg.SweepInterval is negative, the store runs one goroutine that
// reclaims expired counters. Whoever makes a store closes it: call Close
// once no Limiter uses it. (A Limiter built without WithStore makes its own
// in-memory store, and closes it in Limiter.Close.)
func NewMemoryStore(cfg MemoryConfig) (*MemoryStore, error) {
	s, err := memstore.New(memstore.Config{
		MaxKeys:       cfg.MaxKeys,
		Shards:        cfg.Shards,
		Now:           cfg.Now,
		SweepInterval: cfg.SweepInterval,
	})
	if err != nil {
		return nil, err
	}
	return &MemoryStore{s: s, slots: slots.New()}, nil
}

// Take decides charges at now (the zero time means the store's clock). It
// implements Store.
func (m *MemoryStore) Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return m.s.Take(ctx, now, internalCharges(charges), internalDecisions(out))
}

// takeValid is Take for the charges of the Limiter's rules, whose limits
// were checked when they were compiled (memstore.Store.TakeValid).
func (m *MemoryStore) takeValid(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return m.s.TakeValid(ctx, now, internalCharges(charges), internalDecisions(out))
}

// GiveBack gives back the places of charges admitted with a Delay. It
// implements Returner.
func (m *MemoryStore) GiveBack(ctx context.Context, now time.Time, charges []Charge) error {
	return m.s.GiveBack(ctx, now, internalCharges(charges))
}

// Reset drops the counters the charges name. It implements Resetter.
func (m *MemoryStore) Reset(ctx context.Context, charges []Charge) error {
	return m.s.Reset(ctx, internalCharges(charges))
}

// Acquire takes a concurrency slot. It implements SlotStore. The slots of a
// MemoryStore are this process's alone: they have no lease, and every
// Limiter that uses the store shares them.
func (m *MemoryStore) Acquire(ctx context.Context, now time.Time, s *Slot) (ok bool, held int, err error) {
	return m.slots.Acquire(ctx, now, (*window.Slot)(s))
}

// Release gives back a concurrency slot. It implements SlotStore.
func (m *MemoryStore) Release(ctx context.Context, s *Slot) error {
	return m.slots.Release(ctx, (*window.Slot)(s))
}

// Renew does nothing: the slots of a MemoryStore have no lease. It
// implements SlotStore.
func (m *MemoryStore) Renew(ctx context.Context, now time.Time, s []*Slot) error {
	return m.slots.Renew(ctx, now, internalSlots(s))
}

// StoreTraits reports that the store is local and fails fast. It
// implements TraitsReporter.
func (m *MemoryStore) StoreTraits() StoreTraits {
	return StoreTraits{Local: true, FailsFast: true}
}

// Len returns the number of counters held, expired or not. It implements
// MemoryReporter.
func (m *MemoryStore) Len() int { return m.s.Len() }

// Evictions returns how many counters were dropped to stay within
// MaxKeys. It implements MemoryReporter.
func (m *MemoryStore) Evictions() uint64 { return m.s.Evictions() }

// Close stops the sweeper goroutine and waits for it to return. It is
// idempotent and returns nil. The store still decides after Close; expired
// counters are then reclaimed only as new counters arrive.
func (m *MemoryStore) Close() error { return m.s.Close() }

// TakeAt is Take that also returns the instant the store decided at; see
// Refunder.
func (m *MemoryStore) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	return m.s.TakeAt(ctx, now, internalCharges(charges), internalDecisions(out))
}

// Refund gives back admitted charges; see Refunder.
func (m *MemoryStore) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return m.s.Refund(ctx, at, internalCharges(charges))
}

// Settle charges costs whether they fit or not; see Settler.
func (m *MemoryStore) Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error {
	return m.s.Settle(ctx, now, internalCharges(charges), internalDecisions(out))
}
