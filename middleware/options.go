package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/denycache"
)

// Option configures a Limiter.
type Option func(*config)

// FailurePolicy says what a Limiter does when its store fails (Redis down,
// slow past its timeout, or answering garbage).
type FailurePolicy uint8

const (
	// FailOpen lets the request through without rate-limit headers: a
	// store outage does not become a service outage. The default.
	FailOpen FailurePolicy = iota
	// FailClosed answers the request through the error handler (503 by
	// default): nothing passes undecided.
	FailClosed
	// FailLocal decides the request with a local fallback store (an
	// in-memory store by default, see WithFallbackStore) while the main
	// store fails. Each app server then counts on its own, so with N
	// servers a client may get up to N times the limit; give the fallback
	// lower limits through a rule's LimitsFunc if that matters.
	FailLocal
)

// String returns "fail-open", "fail-closed" or "fail-local".
func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	case FailLocal:
		return "fail-local"
	}
	return fmt.Sprintf("FailurePolicy(%d)", p)
}

// NoKeyPolicy says what a Limiter does with a request for which a rule's key
// function found no key (a missing API key header, an anonymous user).
type NoKeyPolicy uint8

const (
	// NoKeyReject answers through the error handler: 400 Bad Request by
	// default. Such requests never share one silent bucket. The default.
	NoKeyReject NoKeyPolicy = iota
	// NoKeyAllow leaves the request unlimited by that rule. Use it only
	// when another rule (such as a per-IP one) still covers the request,
	// or use keyfunc.First to fall back to another key instead.
	NoKeyAllow
)

type config struct {
	store    Store
	fallback Store
	owned    []interface{ Close() error } // the stores the Limiter made
	style    headers.Style
	deny     http.Handler
	onError  func(http.ResponseWriter, *http.Request, error)
	skip     func(*http.Request) bool
	clock    func() time.Time
	failure  FailurePolicy
	noKey    NoKeyPolicy
	shadow   bool
	errs     []error

	unmatched UnmatchedPolicy

	breakerFailures int
	breakerCooldown time.Duration
	breakerSet      bool
	breaker         *breaker

	denyCacheSize int  // -1: the default for the store
	syncMaxKeys   int  // of the coordination layer (sync.go)
	syncManual    bool // tests: the coordination layer's syncer runs only when called
	denyCache     *denycache.Cache

	lease         time.Duration // of concurrency slots on a shared store
	slots         SlotStore     // nil if the store cannot hold slots
	fallbackSlots SlotStore     // FailLocal's, nil if none
	slotsShared   bool          // slots has leases to renew
	maxWaiting    int64         // requests waiting for a leaky bucket's turn
	pauses        bool          // WithPauses

	observers []Observer // as given to WithObserver
	obs       Observer   // all of them in one; nil if none
	// unobserve removes obs from the stores that report to it.
	unobserve    []func()
	maxOverrides int           // WithMaxOverrides
	clientSync   time.Duration // WithClientSync, 0 for DefaultClientSync

	capacity CapacityConfig // the capacity signal of elastic limits
	overload overloadConfig // shedding by priority
	top      TopConfig      // WithTopClients
}

func defaultConfig() config {
	return config{
		deny:            http.HandlerFunc(DefaultDenyHandler),
		onError:         DefaultErrorHandler,
		breakerFailures: DefaultBreakerFailures,
		breakerCooldown: DefaultBreakerCooldown,
		denyCacheSize:   -1,
		lease:           DefaultConcurrencyLease,
		maxWaiting:      DefaultMaxWaiting,
		maxOverrides:    DefaultMaxOverrides,
	}
}

func (c *config) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("sluice: "+format, args...))
}

// finish checks the options and fills in the defaults that need building.
func (c *config) finish() error {
	if c.style > headers.None {
		c.errorf("WithHeaderStyle: unknown style %d", c.style)
	}
	if c.failure > FailLocal {
		c.errorf("WithFailurePolicy: unknown policy %d", c.failure)
	}
	if c.noKey > NoKeyAllow {
		c.errorf("WithNoKeyPolicy: unknown policy %d", c.noKey)
	}
	if err := errors.Join(c.errs...); err != nil {
		return err
	}
	if err := c.capacity.fill(); err != nil {
		return err
	}
	if c.store == nil {
		s, err := NewMemoryStore(MemoryConfig{Now: c.clock})
		if err != nil {
			return err
		}
		c.store = s
		c.owned = append(c.owned, s)
	}
	if c.failure == FailLocal && c.fallback == nil {
		s, err := NewMemoryStore(MemoryConfig{Now: c.clock})
		if err != nil {
			return err
		}
		c.fallback = s
		c.owned = append(c.owned, s)
	}
	traits := traitsOf(c.store)
	if traits.FailsFast && !c.breakerSet {
		c.breakerFailures = 0
	}
	c.obs = combine(c.observers)
	c.breaker = c.newBreaker()
	if c.obs != nil {
		for i, s := range []Store{c.store, c.fallback} {
			if os, ok := s.(ObservableStore); ok && (i == 0 || !sameStore(s, c.store)) {
				c.unobserve = append(c.unobserve, os.AddObserver(c.obs))
			}
		}
	}
	c.slots, _ = c.store.(SlotStore)
	c.slotsShared = c.slots != nil && !traits.Local
	if c.fallback != nil {
		c.fallbackSlots, _ = c.fallback.(SlotStore)
	}
	size := c.denyCacheSize
	if size < 0 && !traits.Local {
		size = DefaultDenyCacheSize
	}
	if size > 0 {
		c.denyCache = denycache.New(denycache.Config{MaxEntries: size})
	}
	return nil
}

// sameStore reports whether a and b are the same store (false for stores
// whose type is not comparable).
func sameStore(a, b Store) bool {
	return reflect.TypeOf(a).Comparable() && reflect.TypeOf(a) == reflect.TypeOf(b) && a == b
}

// DefaultDenyCacheSize is the number of denials a Limiter remembers by
// default when its store is not in this process's memory.
const DefaultDenyCacheSize = 65536

// WithDenyCache sets how many store denials the limiter remembers, so that
// a client that keeps knocking while it is limited is turned away without
// asking the store again: a counter that denied with a known Retry-After
// is denied locally until then, for requests of at least that cost. The
// cache never admits anything, and never denies longer than the store
// would (it counts from the instant before the store was asked). A flood
// on one key then costs the store about one call per Retry-After per app
// server.
//
// The default is DefaultDenyCacheSize entries for a shared store such as
// Redis, and no cache for the in-memory store, which answers as fast as the
// cache would. size = 0 turns it off; memory stays bounded by size whatever
// keys clients invent (each entry keeps hashes, not keys).
func WithDenyCache(size int) Option {
	return func(c *config) {
		if size < 0 {
			c.errorf("WithDenyCache: size %d must not be negative", size)
			return
		}
		c.denyCacheSize = size
	}
}

// release removes the observers from the stores and closes the stores
// the Limiter made. It is called once.
func (c *config) release() error {
	for _, remove := range c.unobserve {
		remove()
	}
	var errs []error
	for _, o := range c.owned {
		errs = append(errs, o.Close())
	}
	return errors.Join(errs...)
}

// WithStore counts in s instead of the default in-memory store. Use
// NewRedisStore to share limits between app servers. s stays the caller's:
// Limiter.Close does not close it; close it after the Limiters that use it.
func WithStore(s Store) Option {
	return func(c *config) {
		if s == nil {
			c.errorf("WithStore: store is nil")
		}
		c.store = s
	}
}

// WithFallbackStore sets the store FailLocal decides with while the main
// store fails, and selects FailLocal. By default it is a private in-memory
// store, which Limiter.Close closes; s stays the caller's to close.
func WithFallbackStore(s Store) Option {
	return func(c *config) {
		if s == nil {
			c.errorf("WithFallbackStore: store is nil")
		}
		c.fallback, c.failure = s, FailLocal
	}
}

// WithFailurePolicy sets what happens when the store fails: FailOpen (the
// default), FailClosed or FailLocal.
func WithFailurePolicy(p FailurePolicy) Option {
	return func(c *config) { c.failure = p }
}

// WithNoKeyPolicy sets what happens to a request a rule has no key for:
// NoKeyReject (400, the default) or NoKeyAllow.
func WithNoKeyPolicy(p NoKeyPolicy) Option {
	return func(c *config) { c.noKey = p }
}

// WithHeaderStyle selects the rate-limit response fields: headers.Both (the
// default), headers.Legacy, headers.Draft or headers.None.
func WithHeaderStyle(s headers.Style) Option {
	return func(c *config) { c.style = s }
}

// WithDenyHandler answers denied requests with h instead of the default
// 429 JSON response. Rate-limit headers and Retry-After are already set when
// h runs; ResultFromContext(r.Context()) gives the decision.
func WithDenyHandler(h http.Handler) Option {
	return func(c *config) {
		if h == nil {
			c.errorf("WithDenyHandler: handler is nil")
		}
		c.deny = h
	}
}

// WithErrorHandler answers requests that could not be decided: a missing key
// (errors.Is(err, keyfunc.ErrNoKey)) or a store failure under FailClosed
// (errors.Is(err, ErrStore)). The signature is that of
// httputil.ReverseProxy's ErrorHandler. The default is DefaultErrorHandler.
func WithErrorHandler(h func(http.ResponseWriter, *http.Request, error)) Option {
	return func(c *config) {
		if h == nil {
			c.errorf("WithErrorHandler: handler is nil")
		}
		c.onError = h
	}
}

// WithSkip lets requests for which skip reports true through unlimited,
// without rate-limit headers (health checks, internal callers).
func WithSkip(skip func(*http.Request) bool) Option {
	return func(c *config) { c.skip = skip }
}

// WithClock decides every request at the instant now returns instead of the
// store's own clock (Redis TIME for the Redis store). It is meant for tests
// with a fake clock; in production, app servers with skewed clocks agree
// only when the store keeps the time.
func WithClock(now func() time.Time) Option {
	return func(c *config) {
		if now == nil {
			c.errorf("WithClock: clock is nil")
		}
		c.clock = now
	}
}

// WithShadowMode computes, counts and reports every decision but never
// denies: for rolling out limits safely. Requests that would have been
// denied pass with Result.Shadowed set and are reported to
// Observer.Decided.
func WithShadowMode() Option {
	return func(c *config) { c.shadow = true }
}
