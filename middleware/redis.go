package middleware

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisstore"
)

// RedisConfig configures NewRedisStore. The zero value is ready to use.
type RedisConfig struct {
	// Prefix starts every key the store writes; empty means "sluice:". It
	// may not contain '{' or '}'.
	Prefix string
	// Timeout bounds each Take, on top of the request context's deadline;
	// 0 means 100ms and a negative value means no bound of its own. A
	// server that hangs holds a request no longer than that. go-redis ends
	// a hung read at a context deadline only when the client was created
	// with ContextTimeoutEnabled; with other clients the store runs the call
	// on a goroutine of its own and stops waiting at the deadline, so set
	// ContextTimeoutEnabled to spare that goroutine.
	Timeout time.Duration
}

// NewRedisStore returns a Store that keeps its counters in Redis, so that
// every app server that shares the Redis also shares the limits.
//
// client may be a *redis.Client (a single server, or a Sentinel-managed one
// from redis.NewFailoverClient), a *redis.ClusterClient or a *redis.Ring.
// Each decision is one Lua script run (EVALSHA, one round trip) that reads,
// checks and updates all the counters of a request atomically, with the
// time taken from the Redis server (TIME) when Take is given the zero time,
// so that app servers whose clocks disagree still agree on the windows.
//
// Keys are never stored as given: each counter lives at
// "<prefix>{<hash of Key>}:<Name>:<window in ms>", where the hash is 22
// characters of base64url SHA-256 (and a Name outside [A-Za-z0-9_.-]{1,64}
// is hashed too). Hostile keys thus make fixed-size Redis keys, and all the
// counters of one Key share a hash tag: on Redis Cluster they live in one
// slot, and a Ring, which also honours hash tags, puts them on one shard.
//
// On a *redis.ClusterClient or *redis.Ring, a request whose rules use
// different Keys is decided by one script run per Key; if a later one
// denies, the earlier charges are given back, so the request is never
// admitted over a limit, but it takes several round trips and a concurrent
// request may briefly see the charge that is being given back. Prefer one
// Key per request on Cluster. A Ring also moves keys between shards when
// one goes down or comes back, which resets the counters that move.
func NewRedisStore(client redis.Scripter, cfg RedisConfig) (Store, error) {
	s, err := redisstore.New(client, redisstore.Config{Prefix: cfg.Prefix, Timeout: cfg.Timeout})
	if err != nil {
		return nil, err
	}
	return s, nil
}
