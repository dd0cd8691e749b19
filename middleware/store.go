package middleware

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Limit is a number of requests allowed per window, such as PerMinute(100),
// and the algorithm that counts them: the sliding-window counter unless
// Algorithm says otherwise, as in PerSecond(4).TokenBucket(8),
// PerDay(1000).FixedWindow(), PerMinute(5).SlidingLog(),
// PerSecond(2).LeakyBucket(10, 5*time.Second) and
// Calendar(1000, CalendarMonth, loc). Requests must be > 0 and Window a positive whole number of
// milliseconds.
type Limit = window.Limit

// Algorithm is how a Limit counts requests. The README's "Choosing an
// algorithm" compares them.
type Algorithm = window.Algorithm

// The algorithms.
const (
	// SlidingWindow is the sliding-window counter, the default: near-exact
	// (at most Requests + 1 in any interval of one Window) at constant
	// memory.
	SlidingWindow = window.SlidingWindow
	// FixedWindow counts in windows aligned to the Unix epoch, or in
	// calendar periods; the quota renews whole at known instants.
	FixedWindow = window.FixedWindow
	// SlidingLog keeps one entry per admitted request: exact, with memory
	// per client that grows with Requests.
	SlidingLog = window.SlidingLog
	// TokenBucket refills Requests tokens per Window into a bucket of
	// Burst tokens: bursts with a steady average.
	TokenBucket = window.TokenBucket
	// LeakyBucket releases Requests per Window and lets early requests
	// wait for their turn in a queue of Burst, each at most MaxDelay,
	// rather than refusing them.
	LeakyBucket = window.LeakyBucket
)

// Period is a calendar period of a FixedWindow limit.
type Period = window.Period

// The calendar periods.
const (
	// NoPeriod means the limit's Window.
	NoPeriod = window.NoPeriod
	// CalendarDay renews at midnight.
	CalendarDay = window.CalendarDay
	// CalendarWeek renews on Monday at midnight.
	CalendarWeek = window.CalendarWeek
	// CalendarMonth renews on the first of the month at midnight.
	CalendarMonth = window.CalendarMonth
)

// PerSecond returns a limit of n requests per second.
func PerSecond(n int) Limit { return Limit{Requests: n, Window: time.Second} }

// PerMinute returns a limit of n requests per minute.
func PerMinute(n int) Limit { return Limit{Requests: n, Window: time.Minute} }

// PerHour returns a limit of n requests per hour.
func PerHour(n int) Limit { return Limit{Requests: n, Window: time.Hour} }

// PerDay returns a limit of n requests per day (24 hours).
func PerDay(n int) Limit { return Limit{Requests: n, Window: 24 * time.Hour} }

// Calendar returns a fixed-window limit of n requests per calendar period
// in loc (nil means UTC): Calendar(1000, CalendarDay, loc) renews at
// midnight in loc, whatever the length of the day.
func Calendar(n int, p Period, loc *time.Location) Limit {
	return Limit{Requests: n, Algorithm: window.FixedWindow, Period: p, Location: loc}
}

// Charge asks a Store to count Cost against Limit for the counter named by
// Name, Key and Limit.Window. See Store.
type Charge = window.Charge

// Decision is a Store's answer for one Charge.
type Decision = window.Decision

// Store counts requests. Every implementation decides with the same
// sliding-window counter, so that stores can be swapped without changing
// what clients see. A Store is safe for concurrent use.
//
// A store may implement more than Take. A Limiter looks for these
// interfaces on the stores given to WithStore and WithFallbackStore, never
// for concrete types, so a store that wraps another (to add tracing, say)
// keeps the Limiter's behaviour if it forwards them (a struct that embeds
// *RedisStore or *MemoryStore forwards them all):
//
//   - SlotStore: concurrency limits (Rule.Concurrency).
//   - Returner: giving back the turn of a request that left a leaky
//     bucket's queue early.
//   - Resetter: Limiter.Reset.
//   - TraitsReporter: how the Limiter should use the store (deny cache,
//     circuit breaker, lease renewal).
//   - ObservableStore: the store's own events (its servers' health, its
//     batches), which reach the Limiter's Observers.
//   - MemoryReporter: the counters of Limiter.Stats.
//   - PublishSpare, as RedisStore has it: elastic limits share the fleet's
//     spare capacity through it (see CapacityConfig).
//
// Whoever makes a store closes it: a store given to WithStore or
// WithFallbackStore is the caller's to close, after the Limiters that use
// it; the stores a Limiter makes itself (the default in-memory store, and
// FailLocal's default fallback) are closed by Limiter.Close.
type Store interface {
	// Take decides charges at one instant, all or nothing: the request is
	// admitted only if every charge fits its limit, and only then is each
	// charge's cost counted. A denied request is charged to none of them.
	//
	// now is the instant to decide at; the zero time means the store's own
	// clock (Redis TIME for the Redis store, so that app servers with
	// skewed clocks agree). Take writes one Decision per charge into out,
	// which has the same length as charges, and reports whether the request
	// was admitted.
	//
	// Keys are derived from requests and may be hostile: a Store hashes or
	// escapes them, and copies any Key it keeps, since the caller may reuse
	// the memory behind it once Take returns. A non-nil error means nothing
	// was decided; the Limiter's failure policy then applies.
	Take(ctx context.Context, now time.Time, charges []Charge, out []Decision) (allowed bool, err error)
}
