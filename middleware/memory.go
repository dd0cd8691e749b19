package middleware

import (
	"time"

	"github.com/sluicehq/sluice/internal/memstore"
)

var _ Store = (*memstore.Store)(nil)

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

// NewMemoryStore returns a Store that counts in this process's memory:
// exact, sharded, bounded by MaxKeys. It suits a single process, tests and
// development; app servers behind a load balancer need a shared store such
// as NewRedisStore. The returned Store also has a Close method that stops
// its sweeper.
func NewMemoryStore(cfg MemoryConfig) (Store, error) {
	s, err := memstore.New(memstore.Config{
		MaxKeys:       cfg.MaxKeys,
		Shards:        cfg.Shards,
		Now:           cfg.Now,
		SweepInterval: cfg.SweepInterval,
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}
