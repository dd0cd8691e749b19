package middleware

import (
	"net/netip"

	"time"

	"github.com/sluicehq/sluice/keyfunc"
)

// Rule says which requests are limited, who they are counted against and how
// much they may do. Every rule that matches a request applies; the request
// passes only if every limit of every matching rule admits it, and a denied
// request is charged to none of them.
type Rule struct {
	// Name identifies the rule in headers (RateLimit-Policy), hooks and
	// store keys. It must match [A-Za-z0-9_.-]{1,64} and be unique among a
	// limiter's rules. Counters are kept per rule name, so renaming a rule
	// starts its counters afresh.
	Name string

	// Path selects requests by their cleaned URL path: "" or "/*" matches
	// every path, "/api/login" only that path, "/api/*" "/api" and every
	// path below it, and "/users/{id}/posts" (or "/users/*/posts") any one
	// segment in place of {id}.
	Path string

	// Methods, when not empty, limits the rule to these HTTP methods. A
	// rule for GET also matches HEAD, which net/http serves with the GET
	// handler.
	Methods []string

	// Headers, when not empty, limits the rule to requests that carry each
	// of these headers with exactly this value (the header's first value;
	// names are case-insensitive), as in {"X-Tenant": "gold"}.
	Headers map[string]string

	// Query, when not empty, limits the rule to requests whose URL has
	// each of these query parameters with exactly this value (the
	// parameter's first value, unescaped), as in {"plan": "free"}. A front
	// end whose Request does not implement keyfunc.QueryRequest matches no
	// such rule; net/http and the adapters all do.
	Query map[string]string

	// Match, when set, limits the rule further to the requests for which
	// it reports true, on top of Path, Methods, Headers and Query. Unlike
	// Skip, a request Match rejects is one the rule does not apply to at
	// all (see WithUnmatched). It is called on every request the other
	// conditions select and must be fast.
	Match func(r keyfunc.Request) bool

	// Deny, when set, turns away every request the rule applies to (once
	// its key is found and not allowlisted) with 429 Too Many Requests and
	// no Retry-After, charging nothing: a blocklist entry, such as an
	// Envoy descriptor with requests_per_unit: 0. A Deny rule has no
	// Limits, LimitsFunc or Concurrency; a shadow Deny rule only reports
	// the requests it would have denied.
	Deny bool

	// Key says who a request is counted against. Required.
	Key keyfunc.Func

	// Limits are the limits that apply to each key, such as PerSecond(10)
	// and PerHour(1000) at once. At least one is required unless LimitsFunc
	// is set.
	Limits []Limit

	// LimitsFunc, when set, returns the limits for a request and its key,
	// for example from the plan of an API key looked up in memory. It is
	// called on every matching request and must be fast; it replaces
	// Limits, and returning no limits leaves the request unlimited by this
	// rule. Returned limits are validated on every call; an invalid one is
	// an error for the request (see WithErrorHandler).
	LimitsFunc func(r keyfunc.Request, key string) []Limit

	// Cost is how many units each matching request consumes; 0 means 1.
	Cost int

	// CostFunc, when set, computes the cost from the request (for example
	// from the route or the body size) and replaces Cost. A cost below 1
	// counts as 1; a cost above a limit is denied with 429 and no
	// Retry-After, since waiting would not help.
	CostFunc func(r keyfunc.Request) int

	// Overage lets a limit admit this fraction more than its nominal value
	// (0.1 lets 110 requests of a 100/min limit through), while headers
	// keep reporting the nominal limit: a soft throttle for clients that
	// burst a little. 0 means none.
	Overage float64

	// Skip, when it reports true, leaves the request unlimited by this rule.
	Skip func(r keyfunc.Request) bool

	// AllowKeys are keys (as the rule's key function returns them, such as
	// "user:admin" or "ip:192.0.2.10") that this rule never limits.
	AllowKeys []string

	// AllowCIDRs are networks whose clients this rule never limits. They
	// are checked against every IP part ("ip:...") of the rule's key, so
	// the rule's key function decides which IP counts: RemoteIP for the
	// peer, ClientIP for the client behind trusted proxies. A key without
	// an IP part is never allowlisted by CIDR.
	AllowCIDRs []netip.Prefix

	// Shadow computes, counts and reports this rule's decisions (to
	// Observer.Decided) but never denies a request: for rolling out a new
	// limit safely. Shadow rules are counted in a separate store call.
	Shadow bool

	// TopClients is the number of counters of each of the rule's
	// top-client summaries (Limiter.TopClients, see TopConfig): 0 for
	// the limiter's (TopConfig.K), less than 0 to track only the rule's
	// rates, not its clients.
	TopClients int

	// Concurrency, when > 0, lets at most this many requests of one key
	// be in flight at once under this rule, on top of its Limits (a rule
	// may have only a concurrency limit). A request takes a slot before
	// the handler runs and gives it back when the handler returns, panics
	// or sees its client go away; one that finds every slot taken is
	// denied at once (ConcurrencyStatus, 429 by default) with a
	// Retry-After of ConcurrencyRetryAfter, and is charged to no rate
	// limit. On Redis, slots are leases that the limiter renews while the
	// request runs, so that the slots of an app server that dies come back
	// (WithConcurrencyLease). It needs a store that implements SlotStore.
	Concurrency int

	// ConcurrencyStatus is the status of a request denied by Concurrency:
	// 429 Too Many Requests (the default, 0) or 503 Service Unavailable.
	ConcurrencyStatus int

	// Sync is how the app servers that share the Redis store coordinate
	// this rule's counters: SyncExact (the default) decides every request
	// in Redis; SyncLease and SyncWriteBack decide in memory and keep the
	// fleet's count in Redis in the background (with another store than
	// NewRedisStore's, such as the in-memory one, every mode decides
	// exactly), each with the bound on its
	// error that its doc states (see docs/fleet.md). They take sliding
	// windows, fixed windows and token buckets; a rule with another
	// algorithm in another mode than SyncExact is an error (limits from a
	// LimitsFunc with another algorithm are decided exactly). Remaining
	// then comes from the app server's own view. Counters stay where
	// exact mode keeps them, so a rule may change modes without resetting
	// its clients.
	Sync SyncMode
	// Lease is, for SyncLease, the largest slice an app server reserves
	// at once, in cost units; 0 means DefaultLease.
	Lease int
	// SyncInterval is, for SyncWriteBack, how often deltas are pushed and,
	// for SyncLease, how long a slice granted near the limit lives (ten
	// times as long far from it); 0 means DefaultSyncInterval.
	// For ScopeGlobal, it is how often the region's counts are written to
	// the peer regions; 0 means DefaultRegionSyncInterval.
	SyncInterval time.Duration
	// MaxUnsynced is, for SyncWriteBack, how many units one app server
	// may count on one counter before it pushes them at once and waits
	// for the answer; 0 means Requests / 10, between 1 and
	// MaxMaxUnsynced.
	MaxUnsynced int

	// Count, when set, charges the rule's limits only for requests whose
	// response status it matches, such as failed logins; see Count.
	Count Count
	// Usage, when set, limits what the rule's requests use as well, in a
	// unit known in full only once a request has run, such as an LLM's
	// tokens: each request is charged an estimate when admitted and
	// settles what it used when it ends. See Usage. A rule may have only
	// Usage.
	Usage *Usage
	// Scope is whose budget the rule's limits are when app servers run in
	// several regions with a RegionStore: ScopeRegion (the default), the
	// region's; ScopeGlobal, one budget across regions synced in the
	// background every SyncInterval; ScopeGlobalStrict, one budget decided
	// in the home region. With another store every scope is the store's.
	// See Scope and docs/regions.md.
	Scope Scope

	// AdaptiveConcurrency, when set, bounds the requests of this rule in
	// flight in this app server by a limit that follows their latency
	// (see AdaptiveConcurrency), shedding them by Priority. A rule may
	// have only that; it then needs no Key.
	AdaptiveConcurrency *AdaptiveConcurrency

	// Priority is the priority of the requests this rule applies to, for
	// shedding under adaptive concurrency limits: a request takes the
	// highest of the rules that apply to it, unless WithPriority decides.
	// A rule may have only a Priority; it then needs no Key.
	Priority Priority
}
