package middleware

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisprobe"
	"github.com/sluicehq/sluice/internal/redisstore"
	"github.com/sluicehq/sluice/internal/window"
)

// RedisConfig configures NewRedisStore. The zero value is ready to use.
type RedisConfig struct {
	// Prefix starts every key the store writes; empty means "sluice:". It
	// may not contain '{' or '}'.
	Prefix string
	// Timeout bounds each decision, on top of the request context's
	// deadline; 0 means 100ms and a negative value means no bound of its
	// own. The store returns at the deadline whatever the go-redis
	// client's options (go-redis itself ends a hung read at a context
	// deadline only with ContextTimeoutEnabled), and the request
	// context's own deadline is kept.
	//
	// Timeout is also what makes a server slow: one whose round trip (a
	// PING on a connection of the store's own) takes more than three
	// quarters of it answers, but too late to decide within it. Requests
	// for the counters of a slow server go to the failure policy at once,
	// as while it is down, rather than each waiting out Timeout; the
	// server is probed (25ms, doubling up to 200ms) and used again as
	// soon as a probe's PING is answered within three quarters of Timeout.
	// With a negative Timeout, no server is ever slow.
	//
	// One wait goes past the deadline: that for a reply that has come
	// but is not read yet, because this process is short of CPU. The
	// decision waits on, 20ms at a time and up to a second more, only
	// once its server has answered a PING written after the decision was
	// sent (so that its reply was sent before); it waits for that answer
	// within this process's scheduling lag (the runtime's recent figure,
	// or how late the deadline's timer fired) plus 15ms; with more than
	// 25ms of lag, twice the lag plus 15ms, an answer to a PING written up
	// to 100ms before the decision was sent counting too. A server that
	// answers later gets no more than Timeout. In
	// the tests and measurements (TestSlowRedis; BENCHMARKS.md, "A slow
	// Redis"), no decision was held longer than Timeout plus 25ms beyond
	// this process's own scheduling lag, whatever the server's delay.
	Timeout time.Duration
	// StallThreshold is how long a batch of decisions may wait for a
	// server's answer before the server is asked, with a PING on a
	// connection of the store's own, whether it still answers; if it does
	// not within half of Timeout (or twice its recent slowest round trip,
	// at most 100ms, if longer), it is taken as down; if it answers later
	// than three quarters of Timeout, as slow. Either way, requests for
	// its counters then go to the failure policy at once, instead of
	// waiting behind it, until a probe finds it answering in time again.
	// A server that answers the PING in time is up, however late this
	// process is to read its replies (a process short of CPU). 0 means
	// adaptive: 20ms plus twice the server's recent slowest round trip,
	// at most 35ms. A negative value marks servers down only on
	// connection errors, and never slow.
	StallThreshold time.Duration
	// MaxBatch bounds how many decisions share one round trip to one
	// server; 0 means 128.
	MaxBatch int
	// MemoryCheck is how often the store asks each server for its memory
	// figures (INFO memory and stats; CONFIG GET maxmemory* where INFO is
	// refused): when the store first sends to it, then at this interval,
	// never on a request's way. A server whose maxmemory-policy may evict
	// counters is reported to the Observers (a HealthEvent with a
	// MemoryReport, which NewLogObserver logs at Warn with the fix) and
	// in Limiter.Health, as are its evictions and its OOM replies. 0
	// means 30s; a negative value, never (OOM replies are still
	// reported). See docs/redis.md, "Memory".
	MemoryCheck time.Duration
}

// NewRedisStore returns a store that keeps its counters in Redis, so that
// every app server that shares the Redis also shares the limits.
//
// client may be a *redis.Client (a single server, or a Sentinel-managed one
// from redis.NewFailoverClient), a *redis.ClusterClient or a *redis.Ring.
// Each decision is one Lua script (EVALSHA) that reads, checks and updates
// all the counters of a request atomically, with the time taken from the
// Redis server (TIME) when Take is given the zero time, so that app servers
// whose clocks disagree still agree on the windows. Decisions made at the
// same moment by many goroutines share round trips: while one batch is on
// the wire to a server, new decisions queue and go out together in the
// next, with no timer and no goroutine per decision.
//
// The store follows each server's health: a server whose answers stall
// (see RedisConfig.StallThreshold) or whose connection fails is taken as
// down, and one that answers later than three quarters of
// RedisConfig.Timeout as slow; the requests for its counters go to the
// failure policy at once, and it is probed at a short, growing interval
// (25ms, doubling up to 200ms) so that decisions come back from it soon
// after it answers in time again. On Cluster, a node going down makes the
// client reload the slot map, so that a promoted replica is used within
// about a second. A Limiter with such a store needs no circuit breaker of
// its own and has none unless WithBreaker sets one. See docs/redis.md for
// what a user sees for each kind of failure.
//
// Keys are never stored as given: counters are fields of bucket hashes at
// "<prefix>{<3 characters of base64url SHA-256 of Key>}", named by 12
// bytes of SHA-256 over Key, Name and window. Hostile keys thus make
// fixed-size fields, and all the counters of one Key share a hash tag: on
// Redis Cluster they live in one slot, and a Ring, which also honours hash
// tags, puts them on one shard.
//
// On a *redis.ClusterClient or *redis.Ring, a request whose rules use
// different Keys is decided by one script run per Key; if a later one
// denies, the earlier charges are given back, so the request is never
// admitted over a limit, but it takes several round trips and a concurrent
// request may briefly see the charge that is being given back. Prefer one
// Key per request on Cluster. A Ring also moves keys between shards when
// one goes down or comes back, which resets the counters that move.
//
// The store reports its servers going down or slow and coming back, and
// the size of each batch, to its Observers (see ObservableStore): a
// Limiter adds its own in New and removes them in Close.
//
// NewRedisStore probes the server (one script that writes nothing, bounded
// by a second): a server that answers that it lacks what the scripts need
// (Redis before 7.0, miniredis without the struct library that
// middleware/sluicetest/miniredis adds, a server without scripting) is
// refused with an error naming what it lacks; docs/compatibility.md lists
// what works. A server that does not answer is not refused: the failure
// policy covers it.
//
// What operating Redis does to the limits (docs/redis.md, "Running
// Redis"):
//
//   - Slots of a Cluster that move (redis-cli --cluster reshard or
//     rebalance, a managed service scaling) take their counters with them;
//     the store follows MOVED and ASK at once and waits out TRYAGAIN
//     within each decision's Timeout, so a request sees none of them
//     (TestReshard).
//   - A server out of memory with maxmemory-policy noeviction refuses
//     writes (OOM): the requests that would write go to the failure policy
//     at once, and Limiter.Health reports it. A server whose policy may
//     evict counters (any other, with a maxmemory) is reported to the
//     Observers at start, with the fix, and in Health: an evicted counter
//     is a client starting afresh. See RedisConfig.MemoryCheck.
//   - A server restarted empty (no persistence) loses every counter: per
//     window open at the restart, a key is admitted at most what its
//     counter held (at most its limit) over its limit; app servers whose
//     deny cache denied it keep denying until its Retry-After. See
//     SyncLease, SyncWriteBack and RegionStore for the fleet modes and
//     regions.
//
// The store runs goroutines of its own (workers for each server it has
// sent decisions to, and probes of servers that are down). Whoever makes a store
// closes it: call Close once the Limiters that use it are closed. Closing
// the store does not close client.
func NewRedisStore(client redis.Scripter, cfg RedisConfig) (*RedisStore, error) {
	rs := &RedisStore{}
	pc := redispipe.Config{
		StallThreshold: cfg.StallThreshold,
		MaxBatch:       cfg.MaxBatch,
		OnStateChange:  rs.health,
		OnBatch:        rs.batch,
		MemoryEvery:    cfg.MemoryCheck,
		OnMemory:       rs.memory,
	}
	s, err := redisstore.New(client, redisstore.Config{Prefix: cfg.Prefix, Timeout: cfg.Timeout, Pipeline: pc})
	if err != nil {
		return nil, err
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = redisstore.DefaultPrefix
	}
	if err := redisprobe.Check(context.Background(), client, prefix); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("sluice: NewRedisStore: %w", err)
	}
	rs.s = s
	return rs, nil
}

// RedisStore keeps counters in Redis, so that every app server that shares
// the Redis also shares the limits. It is a Store, and also a SlotStore, a
// Returner, a Resetter, a TraitsReporter and an ObservableStore. Make one
// with NewRedisStore. It is safe for concurrent use.
type RedisStore struct {
	s   *redisstore.Store
	obs observerSet

	mu sync.Mutex
	// evicting holds, by server, the warning that it may evict counters,
	// for observers added later (see memory).
	evicting map[string]HealthEvent
}

// The interfaces a RedisStore implements.
var (
	_ Store           = (*RedisStore)(nil)
	_ SlotStore       = (*RedisStore)(nil)
	_ Returner        = (*RedisStore)(nil)
	_ Resetter        = (*RedisStore)(nil)
	_ TraitsReporter  = (*RedisStore)(nil)
	_ ObservableStore = (*RedisStore)(nil)
)

// Take decides charges at now (the zero time means Redis TIME). It
// implements Store.
func (r *RedisStore) Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, error) {
	return r.s.Take(ctx, now, internalCharges(charges), internalDecisions(out))
}

// GiveBack gives back the places of charges admitted with a Delay. It
// implements Returner.
func (r *RedisStore) GiveBack(ctx context.Context, now time.Time, charges []Charge) error {
	return r.s.GiveBack(ctx, now, internalCharges(charges))
}

// Reset drops the counters the charges name. It implements Resetter.
func (r *RedisStore) Reset(ctx context.Context, charges []Charge) error {
	return r.s.Reset(ctx, internalCharges(charges))
}

// Acquire takes a concurrency slot, held for s.Lease unless renewed. It
// implements SlotStore.
func (r *RedisStore) Acquire(ctx context.Context, now time.Time, s *Slot) (ok bool, held int, err error) {
	return r.s.Acquire(ctx, now, (*window.Slot)(s))
}

// Release gives back a concurrency slot. It implements SlotStore.
func (r *RedisStore) Release(ctx context.Context, s *Slot) error {
	return r.s.Release(ctx, (*window.Slot)(s))
}

// Renew extends the leases of slots still held. It implements SlotStore.
func (r *RedisStore) Renew(ctx context.Context, now time.Time, s []*Slot) error {
	return r.s.Renew(ctx, now, internalSlots(s))
}

// fleetBackend returns the store through which the coordination layer of
// lease and write-back modes counts; see fleetBacked.
func (r *RedisStore) fleetBackend() *redisstore.Store { return r.s }

// publishSpare publishes this app server's spare capacity and reads the
// fleet's; see fleetPublisher.
func (r *RedisStore) publishSpare(ctx context.Context, now time.Time, server string, spare float64, ttl time.Duration) (fleet float64, servers int, err error) {
	return r.s.PublishSpare(ctx, now, server, spare, ttl)
}

// StoreTraits reports that the store is shared and, for a *redis.Client,
// *redis.ClusterClient or *redis.Ring (whose servers it follows), that it
// fails fast. It implements TraitsReporter.
func (r *RedisStore) StoreTraits() StoreTraits {
	return StoreTraits{FailsFast: r.s.PerServerHealth()}
}

// AddObserver has the store report its servers' health and its batch
// sizes to o until remove is called, and tells it at once of the servers
// known to be able to evict counters (see RedisConfig.MemoryCheck). A nil
// o is ignored. It implements ObservableStore.
func (r *RedisStore) AddObserver(o Observer) (remove func()) {
	if o == nil {
		return func() {}
	}
	remove = r.obs.add(o)
	for _, ev := range r.memoryWarnings() {
		o.StoreHealth(ev)
	}
	return remove
}

// Close stops the store's goroutines and waits for them; decisions still
// waiting for a reply fail, and later ones fail at once. It is idempotent.
// It does not close the Redis client.
func (r *RedisStore) Close() error { return r.s.Close() }

// health passes a server's state change to the observers.
func (r *RedisStore) health(server string, up bool, cause error) {
	e := HealthEvent{Server: server, Up: up, Slow: !up && errors.Is(cause, redispipe.ErrSlow), Cause: cause}
	for _, o := range r.obs.load() {
		o.StoreHealth(e)
	}
}

// batch passes the size of a batch to the observers.
func (r *RedisStore) batch(n int) {
	for _, o := range r.obs.load() {
		o.StoreBatch(n)
	}
}

// observerSet is a set of Observers read without a lock.
type observerSet struct {
	mu   sync.Mutex
	list atomic.Pointer[[]Observer]
	next uint64
	ids  []uint64 // of list's entries, guarded by mu
}

// load returns the observers; the slice is never written to.
func (s *observerSet) load() []Observer {
	if p := s.list.Load(); p != nil {
		return *p
	}
	return nil
}

// add adds o and returns the function that removes it.
func (s *observerSet) add(o Observer) (remove func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id := s.next
	list := append(slices.Clip(s.load()), o)
	s.ids = append(s.ids, id)
	s.list.Store(&list)
	var once sync.Once
	return func() { once.Do(func() { s.remove(id) }) }
}

func (s *observerSet) remove(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.ids, id)
	if i < 0 {
		return
	}
	list := slices.Delete(slices.Clone(s.load()), i, i+1)
	s.ids = slices.Delete(s.ids, i, i+1)
	s.list.Store(&list)
}

// The Redis store keeps bans and overrides for the fleet.

func (r *RedisStore) setBan(ctx context.Context, now time.Time, rule, key string, d time.Duration) (time.Time, error) {
	return r.s.SetBan(ctx, now, rule, key, d)
}

func (r *RedisStore) bannedUntil(ctx context.Context, now time.Time, rule, key string) (time.Time, error) {
	return r.s.BannedUntil(ctx, now, rule, key)
}

func (r *RedisStore) liftBan(ctx context.Context, rule, key string) (bool, error) {
	return r.s.LiftBan(ctx, rule, key)
}

func (r *RedisStore) bans(ctx context.Context, now time.Time, limit int) ([]redisstore.Ban, int, error) {
	return r.s.Bans(ctx, now, limit)
}

func (r *RedisStore) adminVersion(ctx context.Context) (int64, error) { return r.s.AdminVersion(ctx) }

func (r *RedisStore) setOverride(ctx context.Context, now time.Time, rule, key string, value []byte, until time.Time, max int) error {
	return r.s.SetOverride(ctx, now, rule, key, value, until, max)
}

func (r *RedisStore) removeOverride(ctx context.Context, rule, key string) (bool, error) {
	return r.s.RemoveOverride(ctx, rule, key)
}

func (r *RedisStore) loadOverrides(ctx context.Context) (int64, []redisstore.StoredOverride, error) {
	return r.s.LoadOverrides(ctx)
}

// TakeAt is Take that also returns the instant Redis decided at; see
// Refunder.
func (r *RedisStore) TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (bool, time.Time, error) {
	return r.s.TakeAt(ctx, now, internalCharges(charges), internalDecisions(out))
}

// Refund gives back admitted charges; see Refunder.
func (r *RedisStore) Refund(ctx context.Context, at time.Time, charges []Charge) error {
	return r.s.Refund(ctx, at, internalCharges(charges))
}

// Settle charges costs whether they fit or not, in one script call
// through the same batches as Take; see Settler.
func (r *RedisStore) Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error {
	return r.s.Settle(ctx, now, internalCharges(charges), internalDecisions(out))
}
