// Package middleware rate-limits HTTP handlers.
//
// A [Limiter] holds rules ([Rule]: which requests, who is counted, how
// much they may do), a [Store] that counts, and how to answer: the
// rate-limit headers, the 429 response, and what to do when the store
// fails ([FailurePolicy]). [Limiter.Handler] wraps a net/http handler;
// [Limiter.Decide] is the framework-neutral call that the Gin, Echo,
// Fiber, gRPC and outbound adapters use. A Limiter is safe for concurrent
// use. ARCHITECTURE.md, at the repository's root, maps the code.
//
// # Limiting requests
//
// [New] limits every request by one [Limit]; [NewRules] takes a list of
// [Rule]s, matched by path, method and header, each with its key function
// (package keyfunc), its limits and its cost ([Rule.Cost],
// [Rule.CostFunc]). Each Limit counts with one of five algorithms
// ([Algorithm]): the sliding-window counter (the default), a fixed window
// (or a calendar [Period]), a sliding log, a token bucket and a leaky
// bucket that queues (docs/algorithms.md). A rule may also bound a key's
// requests in flight ([Rule.Concurrency]), deny outright ([Rule.Deny]),
// only report ([Rule.Shadow]), count by the response's status ([Count]),
// or charge a cost known only after the response: an estimate at arrival,
// settled by the handler ([Settle], [Result.Settle]) or a response header
// ([Usage], docs/usage.md). [Limiter.SetRules] swaps the rules while
// serving; package config loads them from files and rules services
// (docs/rules.md). See the examples of [New], [Count] and [Settle], and
// the package's hybridKey example.
//
// # Stores
//
// [NewMemoryStore] counts in one process (the default); [NewRedisStore]
// shares the counts of a fleet through Redis (standalone, Sentinel or
// Cluster), each decision one atomic script run on Redis's clock, round
// trips shared between requests, and a server that is down or slow
// answered by the failure policy within [RedisConfig.Timeout]
// (docs/redis.md). [WithFailurePolicy] and [WithFallbackStore] choose
// between failing open, closed, or counting locally. See the examples of
// [NewMemoryStore], [NewRedisStore] and [WithFailurePolicy], and the
// package's wrappedStore example.
//
// # Fleet and regions
//
// A rule's [SyncMode] trades exactness for fewer round trips: lease
// (slices of the budget spent locally) and write-back (local counts
// pushed), each with its bound stated in [SyncMode] and docs/fleet.md. A
// [Scope] of global shares a budget across regions through
// [NewRegionStore] (docs/regions.md). See the examples of [ParseSyncMode],
// [NewRegionStore] and [ParseScope], and the package's fleetMode example.
//
// # Operations
//
// Elastic limits open towards a ceiling while the server has capacity to
// spare, and [AdaptiveConcurrency] with [WithCapacity] and [Priority]
// sheds load under overload (docs/overload.md). Bans ([Limiter.Ban]),
// per-client overrides ([Limiter.SetOverride]) and outbound pauses
// ([Limiter.Pause], docs/outbound.md) act on single clients, for the
// fleet when the store is Redis. [WithTopClients] tracks who is being
// limited; [AdminHandler] serves all of it as JSON and as an operator
// page (docs/operations.md). See the examples of [Limit] (elastic),
// [AdaptiveConcurrency] and [Limiter.SetOverride].
//
// # Observing
//
// An [Observer] ([WithObserver]; [Hooks] for a few functions;
// [NewLogObserver] for log/slog; the Prometheus and OpenTelemetry modules)
// sees every decision, store call, settle, health change, fleet sync,
// region event and outbound wait. [Limiter.Stats], [Limiter.Health] and
// [Limiter.TopClients] answer on demand. See the examples of [Hooks],
// [NewLogObserver] and [RedisStore.AddObserver].
package middleware
