package middleware

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// Limit is a number of requests allowed per window, such as PerMinute(100).
// Requests must be > 0 and Window a positive whole number of milliseconds.
type Limit = window.Limit

// PerSecond returns a limit of n requests per second.
func PerSecond(n int) Limit { return Limit{Requests: n, Window: time.Second} }

// PerMinute returns a limit of n requests per minute.
func PerMinute(n int) Limit { return Limit{Requests: n, Window: time.Minute} }

// PerHour returns a limit of n requests per hour.
func PerHour(n int) Limit { return Limit{Requests: n, Window: time.Hour} }

// Charge asks a Store to count Cost against Limit for the counter named by
// Name, Key and Limit.Window. See Store.
type Charge = window.Charge

// Decision is a Store's answer for one Charge.
type Decision = window.Decision

// Store counts requests. Every implementation decides with the same
// sliding-window counter, so that stores can be swapped without changing
// what clients see. A Store is safe for concurrent use.
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
