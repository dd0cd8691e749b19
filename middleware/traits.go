package middleware

// StoreTraits says how a Limiter should use a store. The zero value
// describes a store shared by app servers that may fail slowly (a remote
// store with no health tracking of its own): the Limiter then puts a deny
// cache and a circuit breaker in front of it and renews the leases of its
// concurrency slots. That is what a Limiter assumes of a store that is not
// a TraitsReporter.
type StoreTraits struct {
	// Local reports that the store counts in this process's memory and is
	// shared with no other process (MemoryStore): it answers as fast as a
	// deny cache would, so the Limiter gives it none unless WithDenyCache
	// asks for one, and its concurrency slots have no lease to renew.
	Local bool
	// FailsFast reports that the store never keeps a request waiting on
	// a server that is down: it follows the health of each of its servers
	// and answers at once for those that are down (RedisStore), or it has
	// no server (MemoryStore). The Limiter then puts no circuit breaker in
	// front of it unless WithBreaker sets one: a breaker for the whole
	// store would let one failing Redis Cluster node stop the decisions of
	// all.
	FailsFast bool
}

// TraitsReporter is implemented by stores that say how a Limiter should
// use them (see StoreTraits): MemoryStore and RedisStore. A Limiter reads
// the traits once, in New.
type TraitsReporter interface {
	StoreTraits() StoreTraits
}

// ObservableStore is implemented by stores that have events of their own
// to report: RedisStore reports its servers going down and coming back
// (Observer.StoreHealth) and the size of its batches (Observer.StoreBatch).
//
// A Limiter built on such a store adds its observers to it in New and
// removes them in Close, so that the store's events reach the same
// Observers as the Limiter's. Code that uses the store without a Limiter
// may add an Observer itself (a Hooks with only OnStoreHealth set, say).
type ObservableStore interface {
	// AddObserver has the store report its events to o until remove is
	// called. remove is idempotent.
	AddObserver(o Observer) (remove func())
}

// MemoryReporter is implemented by stores that hold counters in this
// process's memory and report how many (MemoryStore). Limiter.Stats adds
// up the figures of its store and its fallback store.
type MemoryReporter interface {
	// Len returns the number of counters held.
	Len() int
	// Evictions returns how many counters were dropped to stay within
	// the store's bound.
	Evictions() uint64
}

// traitsOf returns the traits of s: its own, or those of a store that says
// nothing.
func traitsOf(s Store) StoreTraits {
	if t, ok := s.(TraitsReporter); ok {
		return t.StoreTraits()
	}
	return StoreTraits{}
}
