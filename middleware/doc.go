// Package middleware rate-limits HTTP handlers.
//
// A Limiter holds rules (Rule: which requests, who is counted, how much
// they may do), a Store that counts (NewMemoryStore by default, or
// NewRedisStore to share limits between app servers), and how to answer:
// the rate-limit headers, the 429 response, and what to do when the store
// fails (FailurePolicy). Handler wraps a net/http handler; Decide is the
// framework-neutral call that the Gin, Echo and Fiber adapters use.
//
// Each Limit counts with one of five algorithms (Algorithm): the
// sliding-window counter (the default: near-exact at constant memory), a
// fixed window (aligned to the Unix epoch, or a calendar day, week or
// month), a sliding log (exact), a token bucket (bursts with a steady
// average) and a leaky bucket (a queue released at a steady rate). Both
// stores implement all five with the same arithmetic, so that one can
// replace the other without changing what clients see. docs/algorithms.md
// compares them.
//
// A rule may also bound how many of a key's requests are in flight at once
// (Rule.Concurrency), refuse requests outright (Rule.Deny), or only report
// what it would have denied (Rule.Shadow). Observers (WithObserver: the
// metrics modules, NewLogObserver, Hooks) see every decision, store call
// and change of the store's health.
//
// A Limiter is safe for concurrent use.
package middleware
