package middleware

// Stats are figures of a Limiter that metrics read when they are scraped.
type Stats struct {
	// MemoryKeys is how many counters the in-memory store holds (the
	// Limiter's store, or the fallback of FailLocal: those that are a
	// MemoryReporter); 0 without one.
	MemoryKeys int
	// MemoryEvictions is how many counters the in-memory stores dropped to
	// stay within their MaxKeys.
	MemoryEvictions uint64
	// Waiting is how many requests wait for their turn in a leaky
	// bucket's queue.
	Waiting int64
	// SlotsHeld is how many requests hold concurrency slots.
	SlotsHeld int
	// BreakerOpen reports whether the circuit breaker is open.
	BreakerOpen bool
	// SyncKeys is how many counters of rules in lease or write-back mode
	// the app server keeps in memory, and SyncEvictions how many it
	// dropped to stay within WithSyncMaxKeys.
	SyncKeys      int
	SyncEvictions uint64
}

// Stats returns the limiter's current figures.
func (l *Limiter) Stats() Stats {
	st := Stats{Waiting: l.waiting.Load()}
	for _, s := range []Store{l.cfg.store, l.cfg.fallback} {
		if m, ok := s.(MemoryReporter); ok {
			st.MemoryKeys += m.Len()
			st.MemoryEvictions += m.Evictions()
		}
	}
	l.renew.mu.Lock()
	st.SlotsHeld = len(l.renew.active)
	l.renew.mu.Unlock()
	if b := l.cfg.breaker; b != nil {
		st.BreakerOpen = b.isOpen()
	}
	if fs := l.syncs.store.Load(); fs != nil {
		st.SyncKeys, st.SyncEvictions = fs.Len(), fs.Evictions()
	}
	return st
}
