package middleware

import (
	"errors"
	"strings"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is the error a Limiter reports, wrapped in ErrStore, for
// requests decided without the store while its circuit breaker is open.
var ErrBreakerOpen = errors.New("sluice: circuit breaker open")

// breaker stops calling a failing store for a while, so requests are not
// held up by a store that is down or timing out: after threshold failures
// in a row it opens for cooldown, during which the failure policy answers at
// once; then one request probes the store, closing the breaker if it
// succeeds and opening it again if not.
type breaker struct {
	threshold int64
	cooldown  int64 // nanoseconds
	now       func() time.Time
	onChange  func(open bool)

	failures  atomic.Int64
	openUntil atomic.Int64 // Unix nanoseconds; 0 when closed
	probing   atomic.Bool
}

// allow reports whether the store may be called now.
func (b *breaker) allow() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	if b.now().UnixNano() < until {
		return false
	}
	// Half-open: one request at a time probes the store.
	return b.probing.CompareAndSwap(false, true)
}

func (b *breaker) success() {
	if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
		b.probing.Store(false)
		b.changed(false)
	}
}

func (b *breaker) failure() {
	n := b.failures.Add(1)
	if b.probing.Load() {
		b.openUntil.Store(b.now().UnixNano() + b.cooldown)
		b.probing.Store(false)
		return
	}
	if n == b.threshold {
		b.openUntil.Store(b.now().UnixNano() + b.cooldown)
		b.changed(true)
	}
}

func (b *breaker) changed(open bool) {
	if b.onChange != nil {
		b.onChange(open)
	}
}

// Defaults of the circuit breaker.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
)

// WithBreaker sets the store's circuit breaker: after failures consecutive
// store errors the limiter stops calling the store for cooldown and applies
// the failure policy at once, then lets one request probe the store. The
// default is 5 failures and one second, for stores that do not fail fast
// on their own; the Redis store, which follows the health of its servers
// (see NewRedisStore), and the in-memory store get no breaker unless this
// option sets one (see StoreTraits.FailsFast). failures = 0 turns the
// breaker off, so that every request waits for the store (up to its
// timeout). Observer.BreakerChanged reports the breaker opening and
// closing.
func WithBreaker(failures int, cooldown time.Duration) Option {
	return func(c *config) {
		if failures < 0 || failures > 0 && cooldown <= 0 {
			c.errorf("WithBreaker: want failures >= 0 and cooldown > 0, got %d and %v", failures, cooldown)
		}
		c.breakerFailures, c.breakerCooldown, c.breakerSet = failures, cooldown, true
	}
}

func (c *config) newBreaker() *breaker {
	if c.breakerFailures == 0 {
		return nil
	}
	now := c.clock
	if now == nil {
		now = time.Now
	}
	return &breaker{
		threshold: int64(c.breakerFailures),
		cooldown:  int64(c.breakerCooldown),
		now:       now,
		onChange:  c.breakerHook(),
	}
}

// errBreakerOpen is ErrBreakerOpen wrapped in ErrStore:
// "sluice: store failed: circuit breaker open", with the prefix once.
var errBreakerOpen error = storeError{ErrBreakerOpen}

// storeError wraps, in ErrStore, an error of this package that has the
// "sluice: " prefix already.
type storeError struct{ err error }

func (e storeError) Error() string {
	return ErrStore.Error() + ": " + strings.TrimPrefix(e.err.Error(), "sluice: ")
}

func (e storeError) Unwrap() []error { return []error{ErrStore, e.err} }

// breakerHook returns what the breaker calls when it opens or closes: the
// observers' BreakerChanged, or nil.
func (c *config) breakerHook() func(bool) {
	if c.obs == nil {
		return nil
	}
	return c.obs.BreakerChanged
}

// isOpen reports whether the breaker is open (or half-open, probing).
func (b *breaker) isOpen() bool { return b.openUntil.Load() != 0 }
