package middleware

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redisstore"
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
	// deadline only with ContextTimeoutEnabled), unless the server still
	// answers a PING then: the reply is late because this process is
	// short of CPU, not the server, and the decision waits on for it, up
	// to a second more. The request context's own deadline is kept.
	Timeout time.Duration
	// StallThreshold is how long a batch of decisions may wait for a
	// server's answer before the server is asked, with a PING on a
	// connection of the store's own, whether it still answers; if it does
	// not (within 25ms, or twice its recent slowest round trip, at most
	// 100ms), it is taken as down: requests for its counters then go to
	// the failure policy at once, instead of waiting behind it, until a
	// probe finds it answering again. A server that answers the PING is
	// up, however late this process is to read its replies (a process
	// short of CPU). 0 means adaptive: 20ms plus twice the server's recent
	// slowest round trip, at most 35ms. A negative value marks servers
	// down only on connection errors.
	StallThreshold time.Duration
	// MaxBatch bounds how many decisions share one round trip to one
	// server; 0 means 128.
	MaxBatch int
	// OnHealthChange, if not nil, is called when a Redis server goes down
	// (with the cause) or comes back. On Redis Cluster it names the node;
	// each node is followed on its own, so one node going down affects
	// only the requests for counters it holds.
	OnHealthChange func(HealthEvent)
}

// HealthEvent reports that a store's server went down or came back.
type HealthEvent struct {
	// Server is the address of the Redis server (a Cluster node, a Ring
	// shard, the master of a Sentinel-managed client), or "" when the
	// event is about the store as a whole (the Limiter's own circuit
	// breaker, for stores that do not follow each server).
	Server string
	// Up reports whether the server is answering again.
	Up bool
	// Cause is why it went down (a connection error, or a batch that was
	// outstanding too long); nil when Up.
	Cause error
}

// NewRedisStore returns a Store that keeps its counters in Redis, so that
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
// down, the requests for its counters go to the failure policy at once,
// and it is probed at a short, growing interval (25ms, doubling up to
// 200ms) so that decisions come back from it soon after it answers again.
// On Cluster, a node going down makes the client reload the slot map, so
// that a promoted replica is used within about a second. A Limiter with
// such a store needs no circuit breaker of its own and has none unless
// WithBreaker sets one.
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
// The returned Store has a Close method that stops its pipeline workers;
// call it when the store is no longer used.
func NewRedisStore(client redis.Scripter, cfg RedisConfig) (Store, error) {
	pc := redispipe.Config{StallThreshold: cfg.StallThreshold, MaxBatch: cfg.MaxBatch}
	hub := &healthHub{}
	if fn := cfg.OnHealthChange; fn != nil {
		hub.add(fn)
	}
	pc.OnStateChange = func(server string, up bool, cause error) {
		hub.send(HealthEvent{Server: server, Up: up, Cause: cause})
	}
	pc.OnBatch = hub.sendBatch
	s, err := redisstore.New(client, redisstore.Config{Prefix: cfg.Prefix, Timeout: cfg.Timeout, Pipeline: pc})
	if err != nil {
		return nil, err
	}
	healthHubs.Store(Store(s), hub)
	return s, nil
}

// healthHubs maps each store NewRedisStore made to the listeners of its
// servers' health, so that a Limiter built on it can pass the events on to
// its Observers. Entries are small and there is one per store.
var healthHubs sync.Map

// healthHub fans a store's health events, and the sizes of its batches,
// out to its listeners.
type healthHub struct {
	mu        sync.Mutex
	listeners []func(HealthEvent)
	batches   atomic.Pointer[[]BatchObserver]
}

// addBatch adds a listener of batch sizes.
func (h *healthHub) addBatch(o BatchObserver) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var next []BatchObserver
	if cur := h.batches.Load(); cur != nil {
		next = append(next, *cur...)
	}
	next = append(next, o)
	h.batches.Store(&next)
}

func (h *healthHub) sendBatch(n int) {
	if obs := h.batches.Load(); obs != nil {
		for _, o := range *obs {
			o.StoreBatch(n)
		}
	}
}

func (h *healthHub) add(fn func(HealthEvent)) {
	h.mu.Lock()
	h.listeners = append(h.listeners, fn)
	h.mu.Unlock()
}

func (h *healthHub) send(e HealthEvent) {
	h.mu.Lock()
	ls := h.listeners
	h.mu.Unlock()
	for _, fn := range ls {
		fn(e)
	}
}
