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

// Observer is told what a Limiter does, for metrics and logs: the nested
// modules middleware/metrics/prometheus and middleware/metrics/otel
// implement it, and WithLogger installs one that logs through log/slog.
// Embed NopObserver to implement only some methods. Methods are called on
// the request's goroutine (StoreHealth on a store's) and must be fast and
// safe for concurrent use; they must not keep the Request past the call.
type Observer interface {
	// Decided is called once for every request Decide handles, with its
	// Result (see Result.Outcome), as WithOnDecision is.
	Decided(r keyfunc.Request, res *Result)
	// StoreCalled is called after every call of the store's Take: how long
	// it took and its error, nil on success.
	StoreCalled(d time.Duration, err error)
	// DenyCacheHit is called when the deny cache turned a request away
	// without asking the store; rule is the rule of the denying limit.
	DenyCacheHit(rule string)
	// BreakerChanged is called when the limiter's circuit breaker opens
	// or closes.
	BreakerChanged(open bool)
	// StoreHealth is called when a server of the store goes down or comes
	// back (see RedisConfig.OnHealthChange); the Limiter passes on what
	// its Redis store reports when the store was built with
	// NewRedisStore.
	StoreHealth(e HealthEvent)
	// CapacityChanged is called when a capacity signal moves: the
	// adaptive limit of a rule with AdaptiveConcurrency, or the spare
	// capacity of the Limiter's signal for elastic limits (at most about
	// once per 100ms window of samples each).
	CapacityChanged(e CapacityEvent)
	// ElasticChanged is called when the effective limit of an elastic
	// limit (Limit.Ceiling) of a rule with static limits moves.
	ElasticChanged(e ElasticEvent)
	// Shed is called when an adaptive concurrency limit of rule refuses a
	// request of priority p.
	Shed(rule string, p Priority)
}

// BatchObserver is implemented by Observers that also want the size of
// each batch of decisions a Redis store made with NewRedisStore sends to a
// server (decisions made at the same moment share a round trip). StoreBatch
// is called on the goroutine that sends the batch and must be fast.
type BatchObserver interface {
	StoreBatch(decisions int)
}

// NopObserver does nothing; embed it in an Observer that implements only
// some methods.
type NopObserver struct{}

func (NopObserver) Decided(keyfunc.Request, *Result) {}
func (NopObserver) StoreCalled(time.Duration, error) {}
func (NopObserver) DenyCacheHit(string)              {}
func (NopObserver) BreakerChanged(bool)              {}
func (NopObserver) StoreHealth(HealthEvent)          {}
func (NopObserver) CapacityChanged(CapacityEvent)    {}
func (NopObserver) ElasticChanged(ElasticEvent)      {}
func (NopObserver) Shed(string, Priority)            {}

// WithObserver adds o to the observers of the limiter; it may be given
// several times (metrics and logs, say), and each observer sees
// everything.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.errorf("WithObserver: nil Observer")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// DefaultDenialLogEvery is how many denials WithLogger logs one of.
const DefaultDenialLogEvery = 100

// WithLogger logs, through l, what an operator needs to see: store
// failures (at Warn, at most one a second per kind of failure, with how
// many were not logged) and the requests that failed open while the store
// was down; servers going down and coming back and the circuit breaker
// opening and closing (Warn and Info); and a sample of denials (Info, one
// in DefaultDenialLogEvery, drawn at random) with the rule, the policy and
// the client's key hashed (the first 16 hex digits of its SHA-256), never
// in clear. Rules reloads are logged by package config's Reloader when
// given the same logger.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.errorf("WithLogger: nil logger")
			return
		}
		c.observers = append(c.observers, &logObserver{log: l, every: DefaultDenialLogEvery})
	}
}

// logObserver is WithLogger's Observer.
type logObserver struct {
	NopObserver
	log   *slog.Logger
	every int
	errs  rateLimitedLog
}

func (o *logObserver) Decided(r keyfunc.Request, res *Result) {
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

func (o *logObserver) StoreCalled(_ time.Duration, err error) {
	if err == nil {
		return
	}
	if n, ok := o.errs.allow("store"); ok {
		o.log.LogAttrs(context.Background(), slog.LevelWarn, "sluice: store call failed",
			slog.Any("error", err), slog.Int("not_logged", n))
	}
}

func (o *logObserver) BreakerChanged(open bool) {
	if open {
		o.log.Warn("sluice: circuit breaker open: the store is not called until it recovers")
	} else {
		o.log.Info("sluice: circuit breaker closed: the store decides again")
	}
}

func (o *logObserver) StoreHealth(e HealthEvent) {
	if e.Up {
		o.log.Info("sluice: store server back", slog.String("server", e.Server))
	} else {
		o.log.Warn("sluice: store server down", slog.String("server", e.Server), slog.Any("cause", e.Cause))
	}
}

// hashKey returns the hashed key of the binding rule of a denied request:
// the key functions are run again only for the log sample.
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

// Stats are figures of a Limiter that metrics read when they are scraped.
type Stats struct {
	// MemoryKeys is how many counters the in-memory store holds (the
	// Limiter's store, or the fallback of FailLocal); 0 without one.
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
}

// Stats returns the limiter's current figures.
func (l *Limiter) Stats() Stats {
	st := Stats{Waiting: l.waiting.Load()}
	for _, s := range []Store{l.cfg.store, l.cfg.fallback} {
		if m, ok := s.(*MemoryStore); ok {
			st.MemoryKeys += m.s.Len()
			st.MemoryEvictions += m.s.Evictions()
		}
	}
	l.renew.mu.Lock()
	st.SlotsHeld = len(l.renew.active)
	l.renew.mu.Unlock()
	if b := l.cfg.breaker; b != nil {
		st.BreakerOpen = b.isOpen()
	}
	return st
}
