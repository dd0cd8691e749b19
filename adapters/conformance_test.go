package adapters_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// t0 is where every scenario's clock starts: 30 s into a one-minute window.
var t0 = time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC)

// scenario is a sequence of requests sent to a fresh limiter behind each
// front end, with the response each must give.
type scenario struct {
	name  string
	rules func(t *testing.T) []middleware.Rule
	style headers.Style
	opts  []middleware.Option
	// store, when set, replaces the store under test (memory or Redis);
	// such scenarios run once.
	store func() middleware.Store
	// skip sets each front end's skip hook for skipPath.
	skip  bool
	steps []step
}

// step is one request. The clock moves on by advance before it is sent.
type step struct {
	advance time.Duration
	method  string // GET when empty
	path    string
	header  [][2]string // one header line each
	want    want
}

// want is the expected response. rl nil means no rate-limit headers.
type want struct {
	status int
	rl     *rl
	body   string
	plain  bool // the route's own answer although not a 200
}

// answer is the route's own answer with status and the rate-limit fields
// of an allowed request (see allow).
func answer(status int, p pol, remaining, reset, next int) want {
	w := allow(p, remaining, reset, next)
	w.status, w.plain = status, true
	return w
}

// recovered is the answer of a handler that panicked, with the fields of
// an allowed request.
func recovered(p pol, remaining, reset, next int) want {
	w := answer(http.StatusInternalServerError, p, remaining, reset, next)
	w.body = panicBody
	return w
}

// rl are the expected rate-limit fields.
type rl struct {
	p                pol
	remaining, reset int // X-RateLimit-Remaining (and r), X-RateLimit-Reset
	next             int // t of RateLimit
	retry            int // Retry-After; 0 means absent
	// others are the RateLimit items of the other policies, for a rule
	// with usage limits.
	others string
}

// pol is the binding policy: its name, quota and window in seconds, and the
// whole RateLimit-Policy value.
type pol struct {
	name          string
	limit, window int
	header        string
}

// single is the policy of a rule with one limit of n per minute.
func single(name string, n int) pol {
	return pol{name, n, 60, fmt.Sprintf(`"%s";q=%d;w=60`, name, n)}
}

// allow is a 200 with remaining, reset (whole again) and next (more quota)
// in seconds.
func allow(p pol, remaining, reset, next int) want {
	return want{status: http.StatusOK, rl: &rl{p: p, remaining: remaining, reset: reset, next: next}, body: okBody}
}

// deny is a 429 with remaining, reset, retry (for this request) and next
// (for a request of one unit) in seconds.
func deny(p pol, remaining, reset, retry, next int) want {
	body := fmt.Sprintf(`{"error":"rate limit exceeded","policy":%q,"limit":%d,"window_seconds":%d,"retry_after_seconds":%d}`+"\n",
		p.name, p.limit, p.window, retry)
	return want{status: http.StatusTooManyRequests, rl: &rl{p: p, remaining: remaining, reset: reset, next: next, retry: retry}, body: body}
}

// banned is a 429 of a banned client: every field says when the ban ends,
// left seconds from now.
func banned(p pol, left int) want {
	w := deny(p, 0, left, left, left)
	w.body = strings.Replace(w.body, "rate limit exceeded", "banned for exceeding the rate limit", 1)
	return w
}

var (
	unlimited = want{status: http.StatusOK, body: okBody}
	noKey     = want{status: http.StatusBadRequest, body: `{"error":"request has no rate-limit key (for example a missing API key)"}` + "\n"}
	storeDown = want{status: http.StatusServiceUnavailable, body: `{"error":"rate limiter unavailable"}` + "\n"}
)

func get(path string, header ...[2]string) step { return step{path: path, header: header} }

func post(path string, header ...[2]string) step {
	return step{method: http.MethodPost, path: path, header: header}
}

func (s step) after(d time.Duration) step { s.advance = d; return s }
func (s step) wants(w want) step          { s.want = w; return s }

func h(name, value string) [2]string { return [2]string{name, value} }

func user(name string) [2]string { return h(userHeader, name) }

// rule returns the rules of a scenario with one rule, named "default", of
// n requests per minute keyed by key.
func rule(n int, key func(t *testing.T) keyfunc.Func) func(t *testing.T) []middleware.Rule {
	return func(t *testing.T) []middleware.Rule {
		return []middleware.Rule{{Name: "default", Key: key(t), Limits: []middleware.Limit{middleware.PerMinute(n)}}}
	}
}

// limitRule returns the rules of a scenario with one rule, named
// "default", of limit l keyed by the peer's address.
func limitRule(l middleware.Limit) func(t *testing.T) []middleware.Rule {
	return func(*testing.T) []middleware.Rule {
		return []middleware.Rule{{Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{l}}}
	}
}

// usageRule returns the rules of a scenario with one rule, "chat", of 5
// requests and 100 tokens per fixed minute per peer address, with an
// estimate of 10 tokens, at most 80 per request, reported in usageHeader.
func usageRule(*testing.T) []middleware.Rule {
	return []middleware.Rule{{
		Name: "chat", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5).FixedWindow()},
		Usage: &middleware.Usage{
			Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(100).FixedWindow()},
			Estimate: 10, Max: 80, Header: usageHeader,
		},
	}}
}

// with adds the RateLimit items of the other policies to w.
func (w want) with(others string) want {
	l := *w.rl
	l.others = others
	w.rl = &l
	return w
}

// countRule returns the rules of a scenario with one rule, named
// "default", of n requests per minute per peer address, counting only the
// responses count matches.
func countRule(n int, count middleware.Count) func(t *testing.T) []middleware.Rule {
	return func(*testing.T) []middleware.Rule {
		return []middleware.Rule{{Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(n)}, Count: count}}
	}
}

func fixed(fn keyfunc.Func) func(*testing.T) keyfunc.Func {
	return func(*testing.T) keyfunc.Func { return fn }
}

func trusted(cidrs ...string) func(*testing.T) keyfunc.Func {
	return func(t *testing.T) keyfunc.Func {
		fn, err := keyfunc.TrustedProxies("X-Forwarded-For", cidrs...)
		if err != nil {
			t.Fatal(err)
		}
		return fn
	}
}

// failingStore fails every decision, as an unreachable Redis would.
type failingStore struct{}

func (failingStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	return false, errors.New("store unreachable")
}

// styleSteps is a burst to a limit of 2 per minute, a denial and the
// recovery once Retry-After has passed.
func styleSteps() []step {
	p := single("default", 2)
	return []step{
		get("/hello").wants(allow(p, 1, 120, 120)),
		get("/hello").wants(allow(p, 0, 120, 90)),
		get("/hello").wants(deny(p, 0, 120, 90, 90)),
		// 90 s on, 30 s into the next window: 2*29999 + 60000 <= 2*60000.
		get("/hello").after(90 * time.Second).wants(allow(p, 0, 90, 30)),
	}
}

func scenarios() []scenario {
	p1, p2, p3, p5 := single("default", 1), single("default", 2), single("default", 3), single("default", 5)
	chatPolicies := `"chat";q=5;w=60, "chat-tokens";q=100;w=60`
	chat, tokens := pol{"chat", 5, 60, chatPolicies}, pol{"chat-tokens", 100, 60, chatPolicies}
	costFunc := func(r keyfunc.Request) int {
		if r.Method() == http.MethodPost {
			return 3
		}
		n, _ := strconv.Atoi(r.Header("X-Cost"))
		return n
	}
	burst1s := pol{"burst-1s", 2, 1, `"burst-1s";q=2;w=1, "burst-1m";q=3;w=60`}
	burst1m := pol{"burst-1m", 3, 60, burst1s.header}
	global, search := single("global", 5), single("search", 2)
	bucket := pol{"default", 4, 120, `"default";q=4;w=120`}
	daily := pol{"default", 1, 86400, `"default";q=1;w=86400`}
	search.header = global.header + ", " + search.header
	return []scenario{
		{
			name:  "remote-ip/burst-then-recover",
			rules: rule(3, fixed(keyfunc.RemoteIP())),
			steps: []step{
				// The window starts at the first request. Reset: whole
				// again at the end of the next window; t: the next unit,
				// c*(59999-y) <= (3-r-1)*60000 into the next window.
				get("/hello").wants(allow(p3, 2, 120, 120)),
				get("/hello", h("X-Forwarded-For", "203.0.113.7")).wants(allow(p3, 1, 120, 90)),
				post("/users/1").wants(allow(p3, 0, 120, 80)),
				get("/hello").wants(deny(p3, 0, 120, 80, 80)),
				get("/hello").wants(deny(p3, 0, 120, 80, 80)),
				get("/hello").after(80 * time.Second).wants(allow(p3, 0, 100, 20)),
				get("/hello").wants(deny(p3, 0, 100, 20, 20)),
			},
		},
		{name: "style/both", style: headers.Both, rules: rule(2, fixed(keyfunc.RemoteIP())), steps: styleSteps()},
		{name: "style/legacy", style: headers.Legacy, rules: rule(2, fixed(keyfunc.RemoteIP())), steps: styleSteps()},
		{name: "style/draft", style: headers.Draft, rules: rule(2, fixed(keyfunc.RemoteIP())), steps: styleSteps()},
		{name: "style/none", style: headers.None, rules: rule(2, fixed(keyfunc.RemoteIP())), steps: styleSteps()},
		{
			// The peer (127.0.0.1) is not a trusted proxy: X-Forwarded-For
			// is ignored, so changing it does not give a fresh counter.
			name:  "client-ip/untrusted-peer",
			rules: rule(2, trusted("10.0.0.0/8")),
			steps: []step{
				get("/hello", h("X-Forwarded-For", "203.0.113.1")).wants(allow(p2, 1, 120, 120)),
				get("/hello", h("X-Forwarded-For", "203.0.113.2")).wants(allow(p2, 0, 120, 90)),
				get("/hello", h("X-Forwarded-For", "203.0.113.3")).wants(deny(p2, 0, 120, 90, 90)),
				get("/hello").wants(deny(p2, 0, 120, 90, 90)),
			},
		},
		{
			// The peer is a trusted proxy: the client is the rightmost
			// untrusted X-Forwarded-For entry, across header lines.
			name:  "client-ip/trusted-peer",
			rules: rule(2, trusted("127.0.0.1/32")),
			steps: []step{
				get("/hello", h("X-Forwarded-For", "203.0.113.1")).wants(allow(p2, 1, 120, 120)),
				get("/hello", h("X-Forwarded-For", "198.51.100.9, 203.0.113.1")).wants(allow(p2, 0, 120, 90)),
				get("/hello", h("X-Forwarded-For", "198.51.100.9"), h("X-Forwarded-For", "203.0.113.1")).wants(deny(p2, 0, 120, 90, 90)),
				get("/hello", h("X-Forwarded-For", "203.0.113.2")).wants(allow(p2, 1, 120, 120)),
				get("/hello").wants(allow(p2, 1, 120, 120)),
			},
		},
		{
			name:  "header",
			rules: rule(2, fixed(keyfunc.Header("X-Tenant"))),
			steps: []step{
				get("/hello", h("X-Tenant", "a")).wants(allow(p2, 1, 120, 120)),
				get("/hello", h("x-tenant", "a")).wants(allow(p2, 0, 120, 90)),
				get("/hello", h("X-Tenant", "a")).wants(deny(p2, 0, 120, 90, 90)),
				get("/hello", h("X-Tenant", "b")).wants(allow(p2, 1, 120, 120)),
				get("/hello").wants(noKey),
			},
		},
		{
			name:  "api-key",
			rules: rule(2, fixed(keyfunc.APIKey("Authorization", []byte("secret")))),
			steps: []step{
				get("/hello", h("Authorization", "Bearer k1")).wants(allow(p2, 1, 120, 120)),
				get("/hello", h("Authorization", "bearer k1")).wants(allow(p2, 0, 120, 90)),
				get("/hello", h("Authorization", "Bearer k1")).wants(deny(p2, 0, 120, 90, 90)),
				get("/hello", h("Authorization", "Bearer k2")).wants(allow(p2, 1, 120, 120)),
				get("/hello").wants(noKey),
				get("/hello", h("Authorization", "Bearer")).wants(noKey),
			},
		},
		{
			name:  "user",
			rules: rule(1, fixed(keyfunc.User(userFrom))),
			steps: []step{
				get("/hello", user("alice")).wants(allow(p1, 0, 120, 120)),
				get("/hello", user("alice")).wants(deny(p1, 0, 120, 120, 120)),
				get("/hello", user("bob")).wants(allow(p1, 0, 120, 120)),
				get("/hello").wants(noKey),
			},
		},
		{
			// Users are counted by ID, anonymous clients by address.
			name:  "first/hybrid",
			rules: rule(2, fixed(keyfunc.First(keyfunc.User(userFrom), keyfunc.RemoteIP()))),
			steps: []step{
				get("/hello", user("alice")).wants(allow(p2, 1, 120, 120)),
				get("/hello", user("alice")).wants(allow(p2, 0, 120, 90)),
				get("/hello").wants(allow(p2, 1, 120, 120)),
				get("/hello", user("bob")).wants(allow(p2, 1, 120, 120)),
				get("/hello", user("alice")).wants(deny(p2, 0, 120, 90, 90)),
				get("/hello").wants(allow(p2, 0, 120, 90)),
				get("/hello").wants(deny(p2, 0, 120, 90, 90)),
			},
		},
		{
			// Requests for one route share a counter whatever the path.
			name:  "route",
			rules: rule(2, fixed(keyfunc.Route())),
			steps: []step{
				get("/users/1").wants(allow(p2, 1, 120, 120)),
				get("/users/2").wants(allow(p2, 0, 120, 90)),
				get("/users/3").wants(deny(p2, 0, 120, 90, 90)),
				get("/hello").wants(allow(p2, 1, 120, 120)),
			},
		},
		{
			name:  "join/tenant-and-route",
			rules: rule(2, fixed(keyfunc.Join(keyfunc.Header("X-Tenant"), keyfunc.Route()))),
			steps: []step{
				get("/users/1", h("X-Tenant", "a")).wants(allow(p2, 1, 120, 120)),
				get("/users/2", h("X-Tenant", "a")).wants(allow(p2, 0, 120, 90)),
				get("/users/3", h("X-Tenant", "b")).wants(allow(p2, 1, 120, 120)),
				get("/hello", h("X-Tenant", "a")).wants(allow(p2, 1, 120, 120)),
				get("/users/3", h("X-Tenant", "a")).wants(deny(p2, 0, 120, 90, 90)),
				get("/users/3").wants(noKey),
			},
		},
		{
			// The front end's own skip hook and a rule's Skip both let
			// requests through without headers.
			name: "skip",
			skip: true,
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{
					Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)},
					Skip: func(r keyfunc.Request) bool { return r.Header("X-Internal") == "yes" },
				}}
			},
			steps: []step{
				get("/hello").wants(allow(p1, 0, 120, 120)),
				get("/hello").wants(deny(p1, 0, 120, 120, 120)),
				get(skipPath).wants(unlimited),
				post(skipPath).wants(unlimited),
				get("/hello", h("X-Internal", "yes")).wants(unlimited),
				get("/hello", h("X-Internal", "no")).wants(deny(p1, 0, 120, 120, 120)),
			},
		},
		{
			name: "match/path-and-method",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{
					Name: "default", Path: "/users/*", Methods: []string{http.MethodPost},
					Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)},
				}}
			},
			steps: []step{
				post("/users/1").wants(allow(p1, 0, 120, 120)),
				post("/users/2").wants(deny(p1, 0, 120, 120, 120)),
				get("/users/1").wants(unlimited),
				post("/hello").wants(unlimited),
			},
		},
		{
			// Header and query conditions: every front end reads the
			// query its own way (keyfunc.QueryRequest).
			name: "match/headers-and-query",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{
					Name: "default", Headers: map[string]string{"x-tenant": "gold"}, Query: map[string]string{"plan": "free"},
					Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)},
				}}
			},
			steps: []step{
				get("/search?plan=free", h("X-Tenant", "gold")).wants(allow(p1, 0, 120, 120)),
				get("/search?q=a+b&plan=free", h("X-Tenant", "gold")).wants(deny(p1, 0, 120, 120, 120)),
				get("/search?plan=free").wants(unlimited),
				get("/search?plan=pro", h("X-Tenant", "gold")).wants(unlimited),
				get("/search?plan=fre%65", h("X-Tenant", "silver")).wants(unlimited),
				get("/search", h("X-Tenant", "gold")).wants(unlimited),
			},
		},
		{
			// A request no rule applies to is denied with 503 by every
			// front end; a skipped one was matched.
			name: "unmatched/deny",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{
					Name: "default", Path: "/users/*", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)},
					Skip: func(r keyfunc.Request) bool { return r.Header("X-Internal") == "yes" },
				}}
			},
			opts: []middleware.Option{middleware.WithUnmatched(middleware.UnmatchedDeny)},
			steps: []step{
				get("/users/1").wants(allow(p1, 0, 120, 120)),
				get("/hello").wants(want{status: http.StatusServiceUnavailable, body: `{"error":"no rate-limit rule applies to the request"}` + "\n"}),
				get("/users/2", h("X-Internal", "yes")).wants(unlimited),
			},
		},
		{
			// A Deny rule turns its requests away without rate-limit
			// headers; the others go on to the limits.
			name: "rules/deny",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{
					{Name: "blocked", Deny: true, Headers: map[string]string{"X-Client": "bad"}, Key: keyfunc.RemoteIP()},
					{Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)}},
				}
			},
			steps: []step{
				get("/hello", h("X-Client", "bad")).wants(want{status: http.StatusTooManyRequests, body: `{"error":"request denied by rule","policy":"blocked"}` + "\n"}),
				get("/hello").wants(allow(p1, 0, 120, 120)),
			},
		},
		{
			// 2 tokens a minute (one every 30 s) in a bucket of 4: the
			// policy advertises the burst and the time it takes to refill
			// (4 tokens at 2 a minute: 120 s).
			name:  "algorithm/token-bucket",
			rules: limitRule(middleware.PerMinute(2).TokenBucket(4)),
			steps: []step{
				get("/hello").wants(allow(bucket, 3, 30, 30)),
				get("/hello").wants(allow(bucket, 2, 60, 30)),
				get("/hello").wants(allow(bucket, 1, 90, 30)),
				get("/hello").wants(allow(bucket, 0, 120, 30)),
				get("/hello").wants(deny(bucket, 0, 120, 30, 30)),
				// 45 s later 1.5 tokens are back: one is spent, and the
				// half left needs 15 s more.
				get("/hello").after(45 * time.Second).wants(allow(bucket, 0, 105, 15)),
			},
		},
		{
			// 2 a minute in windows aligned to the epoch: t0 is 30 s
			// before the next one, when the whole quota comes back.
			name:  "algorithm/fixed-window",
			rules: limitRule(middleware.PerMinute(2).FixedWindow()),
			steps: []step{
				get("/hello").wants(allow(p2, 1, 30, 30)),
				get("/hello").wants(allow(p2, 0, 30, 30)),
				get("/hello").wants(deny(p2, 0, 30, 30, 30)),
				get("/hello").after(30 * time.Second).wants(allow(p2, 1, 60, 60)),
			},
		},
		{
			// 2 a minute, exact: Retry-After is when the oldest request
			// stops counting.
			name:  "algorithm/sliding-log",
			rules: limitRule(middleware.PerMinute(2).SlidingLog()),
			steps: []step{
				get("/hello").wants(allow(p2, 1, 60, 60)),
				get("/hello").after(10 * time.Second).wants(allow(p2, 0, 60, 50)),
				get("/hello").wants(deny(p2, 0, 60, 50, 50)),
				get("/hello").after(50 * time.Second).wants(allow(p2, 0, 60, 10)),
			},
		},
		{
			// One a calendar day in UTC: t0 is 30 s after midnight.
			name:  "algorithm/calendar-day",
			rules: limitRule(middleware.Calendar(1, middleware.CalendarDay, nil)),
			steps: []step{
				get("/hello").wants(allow(daily, 0, 86370, 86370)),
				get("/hello").wants(deny(daily, 0, 86370, 86370, 86370)),
				get("/hello").after(86370 * time.Second).wants(allow(daily, 0, 86400, 86400)),
			},
		},
		{
			name: "cost/fixed",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}, Cost: 2}}
			},
			steps: []step{
				get("/hello").wants(allow(p5, 3, 120, 90)),
				get("/hello").wants(allow(p5, 1, 120, 75)),
				// Two units do not fit until 75 s; one unit fits now: t=0.
				get("/hello").wants(deny(p5, 1, 120, 75, 0)),
			},
		},
		{
			name: "cost/func",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{Name: "default", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}, CostFunc: costFunc}}
			},
			steps: []step{
				post("/hello").wants(allow(p5, 2, 120, 80)),
				get("/hello").wants(allow(p5, 1, 120, 75)),
				post("/hello").wants(deny(p5, 1, 120, 90, 0)),
				get("/hello", h("X-Cost", "10")).wants(want{
					status: http.StatusTooManyRequests,
					rl:     &rl{p: p5, remaining: 1, reset: 120},
					body:   `{"error":"request cost exceeds the rate limit","policy":"default","limit":5,"window_seconds":60}` + "\n",
				}),
				get("/hello").wants(allow(p5, 0, 120, 72)),
			},
		},
		{
			name: "rules/several",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{
					{Name: "global", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}},
					{Name: "search", Path: "/search", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(2)}},
				}
			},
			steps: []step{
				get("/search").wants(allow(search, 1, 120, 120)),
				get("/search").wants(allow(search, 0, 120, 90)),
				get("/search").wants(deny(search, 0, 120, 90, 90)),
				get("/hello").wants(allow(global, 2, 120, 80)),
			},
		},
		{
			name: "rules/several-limits",
			rules: func(*testing.T) []middleware.Rule {
				return []middleware.Rule{{Name: "burst", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerSecond(2), middleware.PerMinute(3)}}}
			},
			steps: []step{
				get("/hello").wants(allow(burst1s, 1, 2, 2)),
				get("/hello").wants(allow(burst1s, 0, 2, 2)),
				get("/hello").wants(deny(burst1s, 0, 2, 2, 2)),
				// The minute's third: 58 s, then 3*(59999-y) <= 2*60000.
				get("/hello").after(2 * time.Second).wants(allow(burst1m, 0, 118, 78)),
				get("/hello").wants(deny(burst1m, 0, 118, 78, 78)),
			},
		},
		{
			name:  "store-error/fail-open",
			rules: rule(1, fixed(keyfunc.RemoteIP())),
			store: func() middleware.Store { return failingStore{} },
			steps: []step{get("/hello").wants(unlimited), get("/hello").wants(unlimited)},
		},
		{
			name:  "store-error/fail-closed",
			rules: rule(1, fixed(keyfunc.RemoteIP())),
			opts:  []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosed)},
			store: func() middleware.Store { return failingStore{} },
			steps: []step{get("/hello").wants(storeDown), get("/hello").wants(storeDown)},
		},
		{
			// Only failed logins count: successes are charged while in
			// flight (their headers say so) and given back.
			name:  "count/failures",
			rules: countRule(2, middleware.Count{Status: []middleware.Status{401, 403}}),
			steps: []step{
				post("/status/200").wants(answer(200, p2, 1, 120, 120)),
				post("/status/302").wants(answer(302, p2, 1, 120, 120)),
				post("/status/401").wants(answer(401, p2, 1, 120, 120)),
				post("/status/200").wants(answer(200, p2, 0, 120, 90)),
				post("/status/403").wants(answer(403, p2, 0, 120, 90)),
				post("/status/200").wants(deny(p2, 0, 120, 90, 90)),
			},
		},
		{
			// A handler that panics counts as 500: an error.
			name:  "count/panic-is-500",
			rules: countRule(1, middleware.Count{Status: []middleware.Status{middleware.Status5xx}}),
			steps: []step{
				get("/status/404").wants(answer(404, p1, 0, 120, 120)),
				get("/panic").wants(recovered(p1, 0, 120, 120)),
				get("/status/200").wants(deny(p1, 0, 120, 120, 120)),
			},
		},
		{
			// A limit with a ban: once refused, refused for the ban's hour,
			// whatever the window would admit, and the fields say so.
			name:  "ban/hour",
			rules: limitRule(middleware.Limit{Requests: 1, Window: time.Minute, Ban: time.Hour}),
			steps: []step{
				get("/hello").wants(allow(p1, 0, 120, 120)),
				get("/hello").wants(banned(p1, 3600)),
				get("/hello").after(2 * time.Minute).wants(banned(p1, 3480)),
				get("/hello").after(58 * time.Minute).wants(allow(p1, 0, 120, 120)),
			},
		},
		{
			// And is no failed login.
			name:  "count/panic-not-401",
			rules: countRule(1, middleware.Count{Status: []middleware.Status{401}}),
			steps: []step{
				get("/panic").wants(recovered(p1, 0, 120, 120)),
				get("/status/401").wants(answer(401, p1, 0, 120, 120)),
				get("/status/200").wants(deny(p1, 0, 120, 120, 120)),
			},
		},
		{
			// Usage limits: each request is charged its estimate of 10
			// tokens and settles what it used when it ends, through its
			// context or the usage header (never sent to the client), a
			// debt that denies until the window renews; a header that is
			// not a number leaves the estimate, a settle of 0 gives it
			// back. Both policies are in RateLimit.
			name:  "usage/tokens",
			rules: usageRule,
			steps: []step{
				post("/usage/ctx/50").wants(allow(chat, 4, 30, 30).with(`"chat-tokens";r=90;t=30`)),
				post("/usage/header/60").wants(allow(chat, 3, 30, 30).with(`"chat-tokens";r=40;t=30`)),
				// 110 tokens of 100: 10 past the limit until the window
				// renews, 30 s on.
				post("/usage/ctx/5").wants(deny(tokens, 0, 30, 30, 30).with(`"chat";r=3;t=30`)),
				post("/usage/header/many").after(30 * time.Second).wants(allow(chat, 4, 60, 60).with(`"chat-tokens";r=90;t=60`)),
				post("/usage/ctx/0").wants(allow(chat, 3, 60, 60).with(`"chat-tokens";r=80;t=60`)),
				// The settle of 0 gave its 10 back: 10 + 10 used.
				get("/hello").wants(allow(chat, 2, 60, 60).with(`"chat-tokens";r=80;t=60`)),
			},
		},
		{
			// A local fallback decides while the store fails.
			name:  "store-error/fail-local",
			rules: rule(1, fixed(keyfunc.RemoteIP())),
			opts:  []middleware.Option{middleware.WithFailurePolicy(middleware.FailLocal)},
			store: func() middleware.Store { return failingStore{} },
			steps: []step{get("/hello").wants(allow(p1, 0, 120, 120)), get("/hello").wants(deny(p1, 0, 120, 120, 120))},
		},
	}
}

// compared are the response fields compared across front ends; Date,
// Content-Length and the like may differ.
var compared = []string{
	"Content-Type", "X-Content-Type-Options", "Retry-After",
	"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset",
	"Ratelimit", "Ratelimit-Policy", usageHeader,
}

// response is what a front end answered, reduced to the compared fields.
type response struct {
	Status int
	Header http.Header
	Body   string
}

func (r response) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", r.Status)
	for _, k := range compared {
		if v, ok := r.Header[k]; ok {
			fmt.Fprintf(&b, "\n\t%s: %q", k, v)
		}
	}
	fmt.Fprintf(&b, "\n\tbody %q", r.Body)
	return b.String()
}

// expect builds the response w stands for under style.
func expect(w want, style headers.Style) response {
	r := response{Status: w.status, Header: http.Header{}, Body: w.body}
	if w.status == http.StatusOK || w.plain {
		r.Header["Content-Type"] = []string{okContentType}
	} else {
		r.Header["Content-Type"] = []string{middleware.ContentTypeJSON}
		r.Header["X-Content-Type-Options"] = []string{"nosniff"}
	}
	if w.rl == nil {
		return r
	}
	l := w.rl
	if style == headers.Both || style == headers.Legacy {
		r.Header["X-Ratelimit-Limit"] = []string{strconv.Itoa(l.p.limit)}
		r.Header["X-Ratelimit-Remaining"] = []string{strconv.Itoa(l.remaining)}
		r.Header["X-Ratelimit-Reset"] = []string{strconv.Itoa(l.reset)}
	}
	if style == headers.Both || style == headers.Draft {
		r.Header["Ratelimit"] = []string{fmt.Sprintf("%q;r=%d;t=%d", l.p.name, l.remaining, l.next)}
		if l.others != "" {
			r.Header["Ratelimit"][0] += ", " + l.others
		}
		r.Header["Ratelimit-Policy"] = []string{l.p.header}
	}
	if l.retry > 0 {
		r.Header["Retry-After"] = []string{strconv.Itoa(l.retry)}
	}
	return r
}

// storeFor returns a store for one front end, or nil for the limiter's own
// in-memory store.
type storeFor func(t *testing.T, frontEnd string) middleware.Store

// TestConformance plays every scenario against net/http, Gin, Echo and
// Fiber, each on its own loopback server with its own limiter and fake
// clock, once with the in-memory store and once with a real Redis (each
// front end under its own key prefix), and requires every front end to give
// the expected bytes and the same bytes as the others.
func TestConformance(t *testing.T) {
	t.Parallel()
	modes := []struct {
		name  string
		store storeFor
	}{
		{"memory", func(*testing.T, string) middleware.Store { return nil }},
		{"redis", redisStore},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			for _, sc := range scenarios() {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					if sc.store != nil && mode.name != "memory" {
						t.Skip("the scenario brings its own store")
					}
					runScenario(t, sc, mode.store)
				})
			}
		})
	}
}

// redisStore gives each front end its own key prefix on the shared Redis
// server, so that their counters never meet.
func redisStore(t *testing.T, frontEnd string) middleware.Store {
	srv := redistest.Shared(t)
	s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{
		Prefix:  srv.Prefix(t) + strings.ReplaceAll(frontEnd, "/", "-") + ":",
		Timeout: 5 * time.Second,
		// Parallel tests can slow the server down for tens of ms; only
		// the outage tests take a server as down that quickly.
		StallThreshold: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// runScenario plays sc against every front end, then checks each answer
// against the expectation and against the other front ends.
func runScenario(t *testing.T, sc scenario, storeFor storeFor) {
	got := make([][]response, len(frontEnds))
	for i, fe := range frontEnds {
		got[i] = play(t, sc, fe, storeFor)
	}
	for j, st := range sc.steps {
		want := expect(st.want, sc.style)
		for i, fe := range frontEnds {
			if !reflect.DeepEqual(got[i][j], want) {
				t.Errorf("step %d (%s), %s:\n got  %v\n want %v", j, st.path, fe.name, got[i][j], want)
			}
			if i > 0 && !reflect.DeepEqual(got[i][j], got[0][j]) {
				t.Errorf("step %d (%s): %s and %s differ:\n%s: %v\n%s: %v", j, st.path,
					frontEnds[0].name, fe.name, frontEnds[0].name, got[0][j], fe.name, got[i][j])
			}
		}
	}
}

// play sends the scenario's requests to a fresh server of fe and returns
// the responses.
func play(t *testing.T, sc scenario, fe frontEnd, storeFor storeFor) []response {
	clk := testclock.New(t0)
	newLimiter := func(extra ...middleware.Option) *middleware.Limiter {
		opts := []middleware.Option{middleware.WithClock(clk.Now), middleware.WithHeaderStyle(sc.style)}
		switch {
		case sc.store != nil:
			opts = append(opts, middleware.WithStore(sc.store()))
		default:
			if s := storeFor(t, fe.name); s != nil {
				opts = append(opts, middleware.WithStore(s))
			}
		}
		opts = append(append(opts, sc.opts...), extra...)
		lim, err := middleware.NewRules(sc.rules(t), opts...)
		if err != nil {
			t.Fatalf("%s: %v", fe.name, err)
		}
		t.Cleanup(func() { _ = lim.Close() })
		return lim
	}
	base := fe.serve(t, newLimiter, sc.skip)
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)

	out := make([]response, len(sc.steps))
	for j, st := range sc.steps {
		clk.Add(st.advance)
		method := st.method
		if method == "" {
			method = http.MethodGet
		}
		req, err := http.NewRequest(method, base+st.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range st.header {
			req.Header.Add(kv[0], kv[1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: step %d: %v", fe.name, j, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: step %d: %v", fe.name, j, err)
		}
		r := response{Status: resp.StatusCode, Header: http.Header{}, Body: string(body)}
		for _, k := range compared {
			if v, ok := resp.Header[k]; ok {
				r.Header[k] = v
			}
		}
		out[j] = r
	}
	return out
}
