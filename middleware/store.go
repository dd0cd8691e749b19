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
// Calendar(1000, CalendarMonth, loc). Validate says whether a Limit can be
// used; NewRules and SetRules check every limit with it.
type Limit struct {
	// Requests is how many requests (cost units) the window admits, 1 to
	// 2^50. For TokenBucket it is the refill: Requests tokens per Window;
	// for LeakyBucket the rate: Requests per Window.
	Requests int
	// Window is the length of the window: a whole number of milliseconds,
	// 1 ms to 3660 days. A FixedWindow limit with a Period may leave it
	// zero (or set it to the period's nominal length, see Span).
	Window time.Duration
	// Algorithm is how requests are counted; the zero value is
	// SlidingWindow.
	Algorithm Algorithm
	// Burst is a TokenBucket's capacity: how many requests it admits at
	// once after a quiet spell; and a LeakyBucket's queue: how many
	// requests may wait for their turn. Zero means Requests. Other
	// algorithms must leave it zero.
	Burst int
	// Period, for a FixedWindow limit, replaces Window with a calendar
	// period (a day, a week starting on Monday, or a month) in Location,
	// which is not a fixed duration: months have 28 to 31 days, and days
	// 23 to 25 hours across daylight-saving changes. Other algorithms must
	// leave it zero.
	Period Period
	// Location is the time zone of Period; nil means UTC. It must be nil
	// without a Period.
	Location *time.Location
	// MaxLog raises, for a SlidingLog limit, the largest Requests allowed,
	// 1000 when it is zero, up to 100,000: a sliding log keeps one entry
	// per admitted request, so its memory per client grows with Requests
	// (about 12 bytes per entry in Redis, 16 in memory). Other algorithms
	// must leave it zero.
	MaxLog int
	// MaxDelay, for a LeakyBucket limit, is the longest a request may wait
	// for its turn; one that would wait longer is denied. Zero means no
	// bound beyond the queue's length. It must be a whole number of
	// milliseconds; other algorithms must leave it zero.
	MaxDelay time.Duration
	// Ceiling, when above Requests, makes the limit elastic: a client may
	// go past Requests, up to Ceiling, while the app servers have spare
	// capacity, as the Limiter's capacity signal measures it (see
	// WithCapacity). Zero means a fixed limit of Requests.
	Ceiling int
	// Ban, when > 0, bans a client this limit refuses for this long: every
	// request of the client under the limit's rule is then refused, with
	// Retry-After and the RateLimit fields saying when the ban ends,
	// whatever the window would admit (see Limiter.Bans and LiftBan).
	// With Redis the ban is kept there, for the whole fleet. It must be a
	// whole number of milliseconds, at most 3660 days.
	Ban time.Duration
}

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
	return Limit{Requests: n, Algorithm: FixedWindow, Period: p, Location: loc}
}

// TokenBucket returns l counted by a token bucket that refills l.Requests
// tokens per l.Window and holds burst tokens (0 means l.Requests):
// PerSecond(4).TokenBucket(8) admits 8 at once, then 4 per second.
func (l Limit) TokenBucket(burst int) Limit {
	l.Algorithm, l.Burst = TokenBucket, burst
	return l
}

// FixedWindow returns l counted in fixed windows aligned to the Unix
// epoch: PerDay(1000).FixedWindow() renews at 00:00 UTC.
func (l Limit) FixedWindow() Limit {
	l.Algorithm = FixedWindow
	return l
}

// SlidingLog returns l counted by a sliding log, exact: at most l.Requests
// in any interval of l.Window. Requests may not exceed 1000 unless MaxLog
// raises the bound.
func (l Limit) SlidingLog() Limit {
	l.Algorithm = SlidingLog
	return l
}

// LeakyBucket returns l counted by a leaky bucket used as a queue: it
// releases l.Requests per l.Window, and lets up to queue requests wait
// for their turn (0 means l.Requests), each for at most maxDelay (0 means
// no bound beyond the queue's length):
// PerSecond(2).LeakyBucket(10, 3*time.Second).
func (l Limit) LeakyBucket(queue int, maxDelay time.Duration) Limit {
	l.Algorithm, l.Burst, l.MaxDelay = LeakyBucket, queue, maxDelay
	return l
}

// Validate reports whether the limit can be used, with an error that says
// what is wrong when it cannot, such as
// "limit 0/1m0s: requests must be > 0".
func (l Limit) Validate() error { return l.internal().Validate() }

// String returns the limit as "100/1m0s", followed by its algorithm when
// it is not the sliding window ("10/1s token_bucket burst 20",
// "1000/calendar_day Europe/Paris fixed_window").
func (l Limit) String() string { return l.internal().String() }

// Capacity is the most a limit admits at once: Burst for a TokenBucket
// (Requests when Burst is zero), one plus the queue for a LeakyBucket (the
// request served now and those waiting), Requests for every other
// algorithm. It is the quota that the rate-limit headers advertise.
func (l Limit) Capacity() int { return l.internal().Capacity() }

// Span is the limit's window as the rate-limit headers advertise it:
// Window; the nominal length of a calendar period (1 day, 7 days, 30
// days); and, for a token or leaky bucket whose Burst is not Requests, the
// time its capacity takes to refill (drain) from empty (full):
// Capacity * Window / Requests, rounded up to the millisecond.
func (l Limit) Span() time.Duration { return l.internal().Span() }

// Algorithm is how a Limit counts requests. Every store implements every
// algorithm with the same arithmetic, so that stores can be swapped
// without changing what clients see. docs/algorithms.md compares them.
type Algorithm uint8

// The algorithms.
const (
	// SlidingWindow is the sliding-window counter, the default: a count
	// per window and a weighted share of the previous window's count.
	// Near-exact (at most Requests + 1 in any interval of one Window) at
	// constant memory.
	SlidingWindow Algorithm = iota
	// FixedWindow counts requests in windows aligned to the Unix epoch (a
	// day renews at 00:00 UTC), or in calendar periods (see Period). The
	// quota renews whole at known instants; a client may spend it at the
	// end of one window and again at the start of the next, so up to
	// 2 * Requests pass in an interval of one Window that straddles a
	// boundary.
	FixedWindow
	// SlidingLog keeps the instant of every admitted request for one
	// Window: exact (at most Requests in any interval of one Window), at a
	// memory cost per client that grows with Requests (see Limit.MaxLog).
	SlidingLog
	// TokenBucket holds up to Burst tokens (Requests when Burst is 0) and
	// refills Requests tokens per Window, continuously; a request spends
	// one token per unit of cost. It admits bursts of Burst with a steady
	// average of Requests per Window: at most Burst + Requests in any
	// interval of one Window.
	TokenBucket
	// LeakyBucket is a queue drained at Requests per Window: a request
	// that comes when the queue is empty is admitted at once; one that
	// comes early is admitted with a Delay, its turn in the queue, if at
	// most Burst requests are ahead of it (Requests when Burst is 0) and
	// the wait is at most MaxDelay (when set); otherwise it is denied. The
	// requests it admits are released at the steady rate.
	LeakyBucket
)

// String returns the algorithm's name as the rules file spells it:
// "sliding_window", "fixed_window", "sliding_log", "token_bucket" or
// "leaky_bucket".
func (a Algorithm) String() string { return window.Algorithm(a).String() }

// Period is a calendar period of a FixedWindow limit.
type Period uint8

// The calendar periods.
const (
	// NoPeriod means the limit's Window, aligned to the Unix epoch.
	NoPeriod Period = iota
	// CalendarDay renews at midnight in the limit's Location.
	CalendarDay
	// CalendarWeek renews on Monday at midnight in the limit's Location.
	CalendarWeek
	// CalendarMonth renews on the first day of each month at midnight in
	// the limit's Location.
	CalendarMonth
)

// String returns the period's name as the rules file spells it:
// "calendar_day", "calendar_week" or "calendar_month", and "" for
// NoPeriod.
func (p Period) String() string { return window.Period(p).String() }

// Charge asks a Store to count Cost against Limit for the counter named by
// Name, Key and the limit's window. See Store.
type Charge struct {
	// Key identifies who is counted, for example "ip:192.0.2.1". It is
	// derived from the request and may be hostile; stores hash or escape
	// it. Charges with the same Key are kept close together (on Redis
	// Cluster, in one hash slot). Key may be backed by a buffer that is
	// reused after Take returns: a store that keeps it must copy it.
	Key string
	// Name namespaces the counters of different rules that count the same
	// Key: it is the rule's name, from configuration, not from the
	// request.
	Name string
	// Limit is the limit to apply. The counter is identified by Name, Key
	// and the limit's window and algorithm; Limit.Requests may change from
	// call to call (plans) without resetting it.
	Limit Limit
	// Cost is how many units the request consumes; 0 only reads.
	Cost int
	// exact: decided by the store itself even for a rule in lease or
	// write-back mode (a budget learned of an upstream, see
	// learnedLimits); the internal twin reads it (window.Charge.Exact).
	exact bool
}

// Decision is a Store's answer for one Charge.
type Decision struct {
	// Allowed reports whether this limit, on its own, admits the request.
	Allowed bool
	// Remaining is how many more requests of cost 1 this limit would admit
	// right now, after this request was counted (if it was).
	Remaining int
	// ResetAfter is how long until the whole limit is available again if
	// no further request arrives.
	ResetAfter time.Duration
	// RetryAfter is how long until a request of the same cost would be
	// admitted by this limit, if no further request arrives. It is zero
	// when Allowed is true, and -1ns when the cost exceeds the limit.
	RetryAfter time.Duration
	// NextAfter is how long until more quota is made available, if no
	// further request arrives: on an allowed request, until Remaining next
	// grows (zero when the limit is whole); on a denied one, until a
	// request of cost 1 would be admitted (zero if one would be now). It
	// is the t parameter of the RateLimit field.
	NextAfter time.Duration
	// Delay is, for an allowed request of a LeakyBucket, how long it must
	// wait for its turn before it proceeds; zero otherwise.
	Delay time.Duration
	// Debt is how many units the counter is past its limit, rounded up:
	// what settles (Result.Settle) charged beyond it, or what a lowered
	// plan left above it. A limit in debt has Remaining 0 and admits no
	// request until the debt is waited off (see Usage).
	Debt int
}

// Store counts requests for a Limiter. NewMemoryStore and NewRedisStore
// make the two stores of this package; both implement every Algorithm
// with the same arithmetic, so that one can replace the other without
// changing what clients see. A Store is safe for concurrent use.
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
//
// (Elastic limits' shared spare capacity, fleet modes (Rule.Sync), and the
// fleet's bans and overrides reach the Redis store through unexported
// methods of RedisStore, which only embedding forwards.)
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

// Refunder is implemented by stores that can give back charges they
// admitted: the memory and Redis stores. Rules that count only some
// responses (Rule.Count) need one: their requests are charged before the
// handler runs and the charge is given back when the response does not
// count.
type Refunder interface {
	// TakeAt is Take that also returns the instant the charges were
	// decided at (the store's clock when now is the zero time).
	TakeAt(ctx context.Context, now time.Time, charges []Charge, out []Decision) (allowed bool, at time.Time, err error)
	// Refund gives back the costs of charges admitted at at: off a
	// sliding window's count of the window that holds at, a fixed
	// window's count if it is still that window, a token bucket's level;
	// never below zero.
	Refund(ctx context.Context, at time.Time, charges []Charge) error
}

// Settler is implemented by stores that can settle costs after the fact:
// the memory and Redis stores, and RegionStore. Rules with usage limits
// (Rule.Usage) need one: their requests are charged an estimate when
// admitted, and the difference with what they used once they have run.
type Settler interface {
	Refunder
	// Settle charges the costs of charges at now whether they fit or not,
	// a charge that cannot be refused: a counter it takes past its limit
	// is in debt, which the client waits off. It writes one Decision per
	// charge into out, describing the counter after the charge as a read
	// would find it (Debt, Remaining, and NextAfter: when one unit fits
	// again). The zero now means the store's clock.
	Settle(ctx context.Context, now time.Time, charges []Charge, out []Decision) error
}
