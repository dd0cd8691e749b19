package middleware

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/denycache"
	"github.com/sluicehq/sluice/internal/slots"
	"github.com/sluicehq/sluice/keyfunc"
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
	owned    []interface{ Close() error }
	style    headers.Style
	deny     http.Handler
	onError  func(http.ResponseWriter, *http.Request, error)
	skip     func(*http.Request) bool
	clock    func() time.Time
	failure  FailurePolicy
	noKey    NoKeyPolicy
	shadow   bool
	hookErr  func(keyfunc.Request, error)
	hookDec  func(keyfunc.Request, Result)
	errs     []error

	unmatched UnmatchedPolicy

	breakerFailures int
	breakerCooldown time.Duration
	breakerSet      bool
	onBreaker       func(open bool)
	breaker         *breaker

	denyCacheSize int // -1: the default for the store
	denyCache     *denycache.Cache

	lease         time.Duration // of concurrency slots on a shared store
	slots         SlotStore     // nil if the store cannot hold slots
	fallbackSlots SlotStore     // FailLocal's, nil if none
	slotsShared   bool          // slots has leases to renew
	maxWaiting    int64         // requests waiting for a leaky bucket's turn
	observers     []Observer

	capacity CapacityConfig // the capacity signal of elastic limits
	overload overloadConfig // shedding by priority
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
		// The in-memory store does not fail, so it needs no breaker.
		c.breakerFailures = 0
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
	if hs, ok := c.store.(interface{ perServerHealth() bool }); ok && hs.perServerHealth() && !c.breakerSet {
		// The store fails fast per server: a breaker for the whole store
		// would let one failing Cluster node stop the decisions of all.
		c.breakerFailures = 0
	}
	c.breaker = c.newBreaker()
	if hub, ok := healthHubs.Load(c.store); ok && len(c.observers) > 0 {
		obs := c.observers
		hub.(*healthHub).add(func(e HealthEvent) {
			for _, o := range obs {
				o.StoreHealth(e)
			}
		})
		for _, o := range obs {
			if b, ok := o.(BatchObserver); ok {
				hub.(*healthHub).addBatch(b)
			}
		}
	}
	c.slots, c.slotsShared = slotsOf(c.store)
	if c.fallback != nil {
		c.fallbackSlots, _ = slotsOf(c.fallback)
	}
	size := c.denyCacheSize
	if _, local := c.store.(*MemoryStore); size < 0 && !local {
		size = DefaultDenyCacheSize
	}
	if size > 0 {
		c.denyCache = denycache.New(denycache.Config{MaxEntries: size})
	}
	return nil
}

// DefaultDenyCacheSize is the number of denials a Limiter remembers by
// default when its store is not in this process's memory.
const DefaultDenyCacheSize = denycache.DefaultMaxEntries

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

func (c *config) closeOwned() error {
	var errs []error
	for _, o := range c.owned {
		errs = append(errs, o.Close())
	}
	c.owned = nil
	return errors.Join(errs...)
}

func (c *config) report(r keyfunc.Request, err error) {
	if c.hookErr != nil {
		c.hookErr(r, err)
	}
}

func (c *config) observe(r keyfunc.Request, res Result) {
	if c.hookDec != nil {
		c.hookDec(r, res)
	}
	if len(c.observers) > 0 {
		c.tellObservers(r, res)
	}
}

// tellObservers passes res to the observers. It is a function of its own
// so that res is moved to the heap (its address escapes through the
// interface) only when there are observers.
//
//go:noinline
func (c *config) tellObservers(r keyfunc.Request, res Result) {
	for _, o := range c.observers {
		o.Decided(r, &res)
	}
}

// WithStore counts in s instead of the default in-memory store. Use
// NewRedisStore to share limits between app servers.
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
// store.
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
// denied pass with Result.Shadowed set and are reported to WithOnDecision.
func WithShadowMode() Option {
	return func(c *config) { c.shadow = true }
}

// WithOnDecision calls fn once for every request Decide handles, with its
// Result and Outcome: allowed, denied, shadow-denied (Result.ShadowPolicy
// names a shadow rule that would have denied), failed open, decided by the
// fallback, rejected for a missing key, not decided (Decide returned an
// error; a store failure also reaches WithOnError), or not
// limited by any rule. Requests WithSkip exempts never reach Decide. fn
// runs on the request's goroutine and must be fast. It must not keep the Request, or strings read
// from it, past the call: Fiber reuses its buffers and Echo its contexts.
func WithOnDecision(fn func(keyfunc.Request, Result)) Option {
	return func(c *config) { c.hookDec = fn }
}

// WithOnError calls fn with every store failure, whatever the failure
// policy, so that fail-open outages are seen; while the circuit breaker is
// open the store is not called, and WithOnBreakerChange reports that
// instead. fn runs on the request's goroutine and must be fast, and must not
// keep the Request past the call (see WithOnDecision). The Request is nil
// for failures that belong to no request being decided: renewing the
// leases of concurrency slots, and giving slots back after a handler
// returned.
func WithOnError(fn func(keyfunc.Request, error)) Option {
	return func(c *config) { c.hookErr = fn }
}

// slotsOf returns where the concurrency slots of store are held: in this
// process for the in-memory store, in the store itself for a SlotStore
// (shared, with leases), nowhere otherwise.
func slotsOf(store Store) (ss SlotStore, shared bool) {
	if _, local := store.(*MemoryStore); local {
		return localSlots{slots.New()}, false
	}
	if ss, ok := store.(SlotStore); ok {
		return ss, true
	}
	return nil, false
}
