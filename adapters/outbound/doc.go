// Package outbound rate-limits the requests a program sends to other
// APIs with a sluice Limiter: an http.RoundTripper that wraps another
// (http.DefaultTransport by default), so that a client is all a program
// changes, as with otelhttp.NewTransport:
//
//	store, _ := middleware.NewRedisStore(rdb, middleware.RedisConfig{})
//	lim, err := middleware.NewRules([]middleware.Rule{{
//		Name:   "partner",
//		Key:    outbound.Host(),
//		Limits: []middleware.Limit{middleware.PerSecond(100)},
//		Sync:   middleware.SyncLease,
//	}}, middleware.WithStore(store), middleware.WithPauses())
//	...
//	t, err := outbound.New(lim, outbound.Options{})
//	...
//	client := &http.Client{Transport: t}
//
// The Limiter's rules apply as they do to incoming requests, to a view of
// the outgoing request (Request): its method, its URL's path (Rule.Path,
// with its patterns) and query, its headers, and the host it goes to
// (Header("Host")). Host keys a request by the upstream's host,
// FromContext by a key the caller puts in the request's context
// (WithKey: a tenant, for a per-tenant budget at the upstream), and
// keyfunc.Header, keyfunc.Method and keyfunc.Join work unchanged. Cost
// gives a rule (as its CostFunc, or its Usage's EstimateFunc) the cost the
// caller put in the context (WithCost): the tokens an LLM request is
// expected to use.
//
// # Costs known from the answer
//
// A rule with usage limits (middleware.Rule.Usage: tokens a minute)
// reserves each request's estimate before it is sent, and settles what it
// used once the answer says: from the header or trailer the rule's
// Usage.Header names (read, and left in the response for the caller),
// from Options.Usage, a function that reads the response when its body is
// closed, or from the caller, who calls Settle with what it read in the
// body before closing it (that comes first). The difference is charged or
// given back when the body is closed (middleware.Result.Settle and
// Finish).
//
// # Waiting, not failing
//
// A request the Limiter denies waits for its turn instead of failing:
// its wait is the denial's RetryAfter, and the requests of one key wait in
// the order they were first denied, only the oldest asking the Limiter
// again. The wait is bounded by the request's context deadline and by
// Options.MaxWait: a request whose turn would come later fails at once,
// unsent and uncharged, with a *WaitError (ErrTooLong); one whose
// context ends while it waits fails likewise, with the context's error. A
// request is sent only once the Limiter admitted it: the transport never
// sends what the budget does not allow.
//
// # One budget for a fleet
//
// With the Redis store (middleware.NewRedisStore) the processes of a
// fleet share one budget per key. What each coordination mode
// (Rule.Sync) guarantees for outgoing requests:
//
//   - exact: every decision is one atomic call to Redis; the fleet sends
//     what one process would.
//   - lease: each process decides in memory from a slice of the budget it
//     reserved in Redis; the fleet never sends more than exact mode would
//     (per window, at most the limit), at the price of requests that wait
//     while other processes hold unused slices (at most (processes − 1) ×
//     Lease units per window, for one SyncInterval). The natural mode
//     for outgoing requests: keep Lease small beside the limit.
//   - write_back: each process counts in memory and pushes its counts; the
//     fleet may send up to processes × MaxUnsynced more than the limit per
//     window, plus what it sends in one SyncInterval, which the upstream
//     may refuse (and which then pauses the fleet, see below).
//
// With the memory store, the budget is each process's own.
//
// # Listening to the upstream
//
// The transport reads the rate-limit fields of every response, as
// untrusted input (package internal/ratefields, fuzzed): Retry-After, in
// seconds or as an HTTP date; the IETF RateLimit and RateLimit-Policy
// fields (draft-10); X-RateLimit-Limit, -Remaining and -Reset, the reset in
// seconds or as a Unix time (as GitHub sends it); and OpenAI's
// x-ratelimit-remaining-requests and -tokens with their reset durations.
// A negative or unreadable value is ignored; a wait is capped at
// Options.MaxPause (DefaultMaxPause, 15 minutes: a Retry-After of ten
// years pauses for 15 minutes).
//
//   - On a 429 (or a 503) with a Retry-After, the request's keys are
//     paused until then (Limiter.Pause): with Redis, one write per key,
//     which every process of the fleet honours. Every waiting request
//     anywhere resumes after the pause, not before.
//   - When the upstream says that a budget (requests, or tokens) has
//     nothing left until a reset while the Limiter's budget still held a
//     clear share (10%, at least 4) or the upstream refused the request,
//     the keys are paused until the reset.
//   - When the upstream says it has fewer requests left than the
//     Limiter's budget now holds, by that share, and announces no quota,
//     the rule's limit is lowered by the difference for the key until the
//     upstream's reset: the budget follows the upstream's count
//     (Limiter.SetOverride: with Redis, for the whole fleet).
//   - What the answer says of the budget is learned (below).
//
// The bound on refusals: a Limiter made WithPauses checks each request's
// keys for a pause before charging it, so a request that starts after a
// pause was written waits. The upstream can therefore refuse, per pause,
// at most the requests that were already admitted and not yet answered
// when the pause was written: the requests in flight, fleet-wide (with a
// leaky bucket, those holding a turn too).
//
// # Learning the upstream's limit
//
// For the rule and key that bound each request, the transport tells the
// Limiter what the answer says (middleware.Limiter.Learn): the quota the
// upstream announces (RateLimit-Policy's q per w; X-RateLimit-Limit and
// x-ratelimit-limit-requests, with the window their resets show;
// x-ratelimit-limit-tokens for the rule's usage limits), how long the
// answer took after the request's admission, and whether it was refused.
// The Limiter lowers the budget to
//
//	limit(t) = max(1, ⌊min(configured, quota scaled − margin) × f(t)⌋)
//
// never above the limits in force, so that no field can raise it:
//
//   - the margin is 1 + q × s / w units (rounded, at most a quarter of
//     q), s the spread of the recent answers' durations (the 90th
//     percentile of the last 128 less the least): the upstream counts a
//     request when it arrives, the budget when it admits it
//     (Options.Margin sets it);
//   - a lowered budget of a window of at most a second is spent evenly: a
//     token bucket at its rate, with a burst of 2% (at least 2, and the
//     margin), beside its limits;
//   - a lowered budget is decided in Redis request by request, in lease
//     and write-back modes too (after its server spends what a slice it
//     leased before has left): a slice counted when leased and spent
//     later puts an upstream that counts exactly over its limit;
//   - f, shared by the fleet in the store, is 1 until a refusal of a
//     request admitted at least τ (the limit's window, between 1 s and
//     1 min) after the last cut, and after the budget was first heard of
//     (2 τ after its quota was announced or fell), counts: with a quota
//     announced it falls by 2%, else to 0.7 of what the upstream accepts,
//     back to 2% below that within 1.7 τ, then probing slowly (2% more
//     after 20 τ); one process's cut applies to the fleet within 250ms.
//
// Package internal/learn states the convergence and the refusals it
// costs; docs/outbound.md the whole. Options.NoLearning turns learning
// off (the pauses stay).
//
// # Observing
//
// The transport reports to the Limiter's Observers, through
// Observer.Outbound (middleware.OutboundEvent): the requests that waited
// and for how long, those that gave up, the upstream's refusals, the
// pauses, the lowered budgets, the learned limits and their cuts; the
// metrics modules export them as sluice_outbound_*, and
// middleware.Limiter.Learned lists each key's learned budget (the
// operator page shows them). Each wait's decisions reach Observer.Decided as any
// decision does: give the outbound Limiter metrics of its own
// (sluiceprom.WithConstLabels) to tell them from incoming requests'.
// See docs/outbound.md.
package outbound
