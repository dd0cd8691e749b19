package middleware

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/memstore"
	"github.com/sluicehq/sluice/internal/slots"
	"github.com/sluicehq/sluice/internal/window"
)

var (
	_ Store     = (*MemoryStore)(nil)
	_ Resetter  = (*MemoryStore)(nil)
	_ Returner  = (*MemoryStore)(nil)
	_ SlotStore = (*RedisStore)(nil)
	_ Resetter  = (*RedisStore)(nil)
	_ Returner  = (*RedisStore)(nil)
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

// MemoryStore is a Store that counts in this process's memory. Make one
// with NewMemoryStore.
type MemoryStore struct {
	s *memstore.Store
}

// NewMemoryStore returns a Store that counts in this process's memory:
// exact, sharded, bounded by MaxKeys. It suits a single process, tests and
// development; app servers behind a load balancer need a shared store such
// as NewRedisStore. Close stops its sweeper.
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
	return &MemoryStore{s: s}, nil
}

// Take decides charges at one instant, all or nothing; see Store.
func (m *MemoryStore) Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return m.s.Take(ctx, now, internalCharges(charges), internalDecisions(out))
}

// Reset drops the counters named by charges; see Resetter.
func (m *MemoryStore) Reset(ctx context.Context, charges []Charge) error {
	return m.s.Reset(ctx, internalCharges(charges))
}

// GiveBack returns the places of admitted charges; see Returner.
func (m *MemoryStore) GiveBack(ctx context.Context, now time.Time, charges []Charge) error {
	return m.s.GiveBack(ctx, now, internalCharges(charges))
}

// Len returns how many counters the store holds, expired or not.
func (m *MemoryStore) Len() int { return m.s.Len() }

// Close stops the store's sweeper. The store still counts afterwards,
// reclaiming expired counters only as new keys arrive.
func (m *MemoryStore) Close() error { return m.s.Close() }

// localSlots holds the concurrency slots of a Limiter whose store is a
// MemoryStore, in this process.
type localSlots struct {
	t *slots.Table
}

func (l localSlots) Acquire(ctx context.Context, now time.Time, s *Slot) (bool, int, error) {
	return l.t.Acquire(ctx, now, (*window.Slot)(s))
}

func (l localSlots) Release(ctx context.Context, s *Slot) error {
	return l.t.Release(ctx, (*window.Slot)(s))
}

func (l localSlots) Renew(ctx context.Context, now time.Time, ss []*Slot) error {
	return l.t.Renew(ctx, now, internalSlots(ss))
}
