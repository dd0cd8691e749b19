// Package sluicetest helps users of sluice test their own handlers: the
// sixth request in a minute gets 429 with Retry-After 60, and once the
// minute has passed, 200, checked in microseconds with no sleep and no
// server.
//
// It has three parts:
//
//   - Clock, a clock that a test moves by hand, given to a Limiter with
//     Clock.Option (every decision, ban and pause is then made at the
//     clock's instant) and to a memory store with Clock.MemoryStore;
//   - Spend, Exhaust, Peek, Remaining and Reset, which use up a client's
//     budget, read where it stands and forget it, through the Limiter's own
//     Decide, Peek and Reset (the operations the admin handler serves);
//   - ReadFields and the Assert functions, which parse the rate-limit
//     fields of a response (X-RateLimit-*, Retry-After, RateLimit and
//     RateLimit-Policy) strictly, check that the ones present agree with
//     each other, and fail the test with what was wrong through any
//     testing.TB.
//
// It imports only the standard library and sluice's own packages: no
// Redis server and no in-process Redis. Tests that want the Redis store
// itself, on miniredis, use the nested module
// github.com/sluicehq/sluice/middleware/sluicetest/miniredis (see
// docs/testing.md).
package sluicetest
