package middleware

import (
	"context"
	"errors"
	"time"
)

// Slot is one request's hold on a concurrency limit (Rule.Concurrency): one
// of at most Limit requests of a rule and key in flight at once.
type Slot struct {
	// Key and Name identify the counter, as for a Charge. A store that
	// keeps Key must copy it.
	Key, Name string
	// Limit is how many slots of (Name, Key) may be held at once.
	Limit int
	// ID identifies this hold among the others of the counter: a random
	// string, unique per request, that Release and Renew name.
	ID string
	// Lease is how long a store that is shared by several processes keeps
	// the slot unless it is renewed or released, so that the slots of a
	// process that died come back.
	Lease time.Duration
}

// SlotStore is implemented by stores that can limit concurrency: the
// in-memory store and the Redis store. A rule with Concurrency needs one.
//
// A store shared by several processes holds each slot for its Lease unless
// it is renewed or released, so that the slots of a process that died come
// back after the lease; the Limiter renews the slots of requests still in
// flight every third of the lease. now is the instant to decide at; the
// zero time means the store's own clock.
type SlotStore interface {
	// Acquire takes one of s.Limit slots of (s.Name, s.Key) for s.ID, if
	// one is free. It reports whether it did and how many slots are held
	// afterwards (or, if none was free, how many are held).
	Acquire(ctx context.Context, now time.Time, s *Slot) (ok bool, held int, err error)
	// Release gives back the slot of s.ID. Releasing a slot that is no
	// longer held does nothing.
	Release(ctx context.Context, s *Slot) error
	// Renew extends the leases of slots still held to now + Lease. A slot
	// that is no longer held (its lease ran out) is not taken again.
	Renew(ctx context.Context, now time.Time, slots []*Slot) error
}

const (
	// DefaultConcurrencyLease is how long a shared store (Redis) keeps a
	// concurrency slot whose app server stopped renewing it: the slots of
	// an app server that dies come back within this time. Slots of
	// requests still running are renewed every third of it.
	DefaultConcurrencyLease = 30 * time.Second
	// ConcurrencyRetryAfter is the Retry-After of a request denied by a
	// concurrency limit: requests in flight end at no predictable time,
	// so clients are told to try again shortly.
	ConcurrencyRetryAfter = time.Second
)

// WithConcurrencyLease sets how long a shared store keeps the concurrency
// slot of a request whose app server stopped renewing it (see
// DefaultConcurrencyLease). It must be at least 3 s.
func WithConcurrencyLease(d time.Duration) Option {
	return func(c *config) {
		if d < 3*time.Second || d%time.Millisecond != 0 {
			c.errorf("WithConcurrencyLease: %s must be at least 3s and a whole number of milliseconds", d)
			return
		}
		c.lease = d
	}
}

// Done gives back the concurrency slots the request holds (see
// Rule.Concurrency) and its places under adaptive concurrency limits, and
// reports its latency to the capacity signals (Rule.AdaptiveConcurrency,
// Limit.Ceiling), which count it in flight until then. Front ends call it
// once the handler has returned,
// whether it returned normally, panicked or saw its client go away;
// Handler and the Gin, Echo and Fiber adapters do. It is safe to call on
// any Result, more than once, and from any goroutine: slots are given back
// exactly once.
func (res *Result) Done() {
	if res.hold != nil {
		res.hold.release()
	}
}

// Returner is implemented by stores that can give back the place of a
// request admitted with a Delay by a LeakyBucket (or a TokenBucket's
// tokens): the in-memory store and the Redis store. The Limiter calls it
// when a request leaves before its turn, so that the requests after it do
// not wait for it. now is the instant the request was decided at.
type Returner interface {
	GiveBack(ctx context.Context, now time.Time, charges []Charge) error
}

// ErrGaveUp is returned by Decide for a request whose client went away
// (its context was canceled) while it waited for its turn in a leaky
// bucket's queue, or that found too many requests waiting in the whole
// limiter (WithMaxWaiting). Its place in the queue was given back.
var ErrGaveUp = errors.New("sluice: request gave up its turn in the queue")

// DefaultMaxWaiting is how many requests may wait for their turn in
// leaky-bucket queues at once in one Limiter, whatever their keys.
const DefaultMaxWaiting = 10_000

// WithMaxWaiting bounds how many requests may wait for their turn in
// leaky-bucket queues at once in the Limiter, so that a flood spread over
// many keys cannot pile up goroutines: a request over the bound is denied
// at once (429, with Retry-After its turn) and its place given back. Each
// key's queue is bounded by its limit's Burst. The default is
// DefaultMaxWaiting.
func WithMaxWaiting(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.errorf("WithMaxWaiting: %d must be at least 1", n)
			return
		}
		c.maxWaiting = int64(n)
	}
}
