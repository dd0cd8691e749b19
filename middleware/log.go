package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
)

// denialLogEvery is how many denials a LogObserver logs one of.
const denialLogEvery = 100

// LogObserver is an Observer that logs, through log/slog, what an operator
// needs to see:
//
//   - store failures (StoreFailed), at Warn, at most one a second, with how
//     many were not logged, and the requests that failed open while the
//     store was down (Decided with OutcomeFailedOpen), likewise;
//   - a store's servers going down (Warn) and coming back (Info), and
//     their memory: out of memory, evicting or able to evict counters
//     (Warn, with what to do);
//   - the circuit breaker opening (Warn) and closing (Info);
//   - an adaptive concurrency limit shedding requests (Shed, Warn, at most
//     once a second per rule);
//   - an adaptive concurrency limit shedding requests (Warn, at most once a
//     second per rule);
//   - a sample of denials (Info, one in 100, drawn at random) with the rule,
//     the policy and the client's key hashed (the first 16 hex digits of
//     its SHA-256), never in clear.
//
// Give it to a Limiter with WithObserver. Rules reloads are logged by
// package config's Reloader.LogReloads when given the same logger.
type LogObserver struct {
	NopObserver
	log   *slog.Logger
	every int
	errs  rateLimitedLog
}

// NewLogObserver returns a LogObserver that logs through l; nil means
// slog.Default().
func NewLogObserver(l *slog.Logger) *LogObserver {
	if l == nil {
		l = slog.Default()
	}
	return &LogObserver{log: l, every: denialLogEvery}
}

// Decided logs a sample of denials, and requests that failed open.
func (o *LogObserver) Decided(r keyfunc.Request, res *Result) {
	switch res.Outcome {
	case OutcomeDenied:
		if rand.IntN(o.every) != 0 {
			return
		}
		o.log.LogAttrs(context.Background(), slog.LevelInfo, "sluice: request denied (sampled)",
			slog.String("rule", res.Rule), slog.String("policy", res.Policy),
			slog.String("key_hash", hashKey(r, res)), slog.Duration("retry_after", res.RetryAfter),
			slog.Bool("concurrency", res.Concurrency), slog.Int("sample_one_in", o.every))
	case OutcomeFailedOpen:
		if n, ok := o.errs.allow("failed_open"); ok {
			o.log.LogAttrs(context.Background(), slog.LevelWarn, "sluice: store failed, request let through unlimited",
				slog.String("rule", res.Rule), slog.Any("error", res.StoreErr), slog.Int("not_logged", n))
		}
	}
}

// StoreFailed logs store failures, at most one a second.
func (o *LogObserver) StoreFailed(_ keyfunc.Request, err error) {
	if n, ok := o.errs.allow("store"); ok {
		o.log.LogAttrs(context.Background(), slog.LevelWarn, "sluice: store call failed",
			slog.Any("error", err), slog.Int("not_logged", n))
	}
}

// BreakerChanged logs the circuit breaker opening and closing.
func (o *LogObserver) BreakerChanged(open bool) {
	if open {
		o.log.Warn("sluice: circuit breaker open: the store is not called until it recovers")
	} else {
		o.log.Info("sluice: circuit breaker closed: the store decides again")
	}
}

// StoreHealth logs a store's server going down or slow, or coming back,
// and its memory reports: at Warn with what to do (out of memory, able to
// evict counters, evicting), at Info once it can no longer evict.
func (o *LogObserver) StoreHealth(e HealthEvent) {
	switch {
	case e.Memory != nil && e.Cause != nil:
		o.log.Warn("sluice: store server memory", slog.String("server", e.Server), slog.Any("cause", e.Cause))
	case e.Memory != nil:
		o.log.Info("sluice: store server can no longer evict counters", slog.String("server", e.Server),
			slog.String("maxmemory_policy", e.Memory.Memory.Policy))
	case e.Up:
		o.log.Info("sluice: store server back", slog.String("server", e.Server))
	case e.Slow:
		o.log.Warn("sluice: store server slow", slog.String("server", e.Server), slog.Any("cause", e.Cause))
	default:
		o.log.Warn("sluice: store server down", slog.String("server", e.Server), slog.Any("cause", e.Cause))
	}
}

// hashKey returns the hashed key of the binding rule of a denied request.
func hashKey(r keyfunc.Request, res *Result) string {
	if r == nil || res.key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(res.key))
	return hex.EncodeToString(sum[:8])
}

// rateLimitedLog lets one message of each kind through per second and
// counts the others.
type rateLimitedLog struct {
	mu      sync.Mutex
	last    map[string]time.Time
	dropped map[string]int
}

func (l *rateLimitedLog) allow(kind string) (dropped int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.dropped = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if now.Sub(l.last[kind]) < time.Second {
		l.dropped[kind]++
		return 0, false
	}
	l.last[kind] = now
	n := l.dropped[kind]
	l.dropped[kind] = 0
	return n, true
}
