package middleware_test

// Tests of the rule engine: matching, several rules and limits at once,
// cost, plans, overage, allowlists, skip, shadow rules and SetRules. The
// identifiers of this file start with "rules" so that they cannot collide
// with the helpers of the package's other test files.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// rulesT0 is the start of a minute (and of an hour), so that a counter's
// first request lands at the start of its window and ResetAfter is exactly
// two windows.
var rulesT0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// newRulesClock returns a fake clock frozen at rulesT0.
func newRulesClock() *testclock.Clock { return testclock.New(rulesT0) }

// newRulesLimiter returns a Limiter with rules on a frozen clock.
func newRulesLimiter(t testing.TB, rules []middleware.Rule, opts ...middleware.Option) (*middleware.Limiter, *testclock.Clock) {
	t.Helper()
	clk := newRulesClock()
	lim, err := middleware.NewRules(rules, append([]middleware.Option{middleware.WithClock(clk.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim, clk
}

// rulesOK answers 200 "ok".
var rulesOK = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })

// rulesReq builds a request from remote with headers given as name, value
// pairs.
func rulesReq(method, target, remote string, hdr ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return r
}

// rulesServe sends r through h.
func rulesServe(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// rulesHeaders returns the rate-limit fields of h as "Name: value" lines in
// a fixed order, for exact comparisons.
func rulesHeaders(h http.Header) string {
	var b strings.Builder
	for _, k := range []string{headers.Limit, headers.Remaining, headers.Reset, headers.RateLimit, headers.RateLimitPolicy, headers.RetryAfter} {
		for _, v := range h.Values(k) {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	return b.String()
}

// rulesHeaderKey keys requests by the X-Key header, unhashed, as "k:value",
// so that tests can name keys.
func rulesHeaderKey(r keyfunc.Request) (string, error) {
	if v := r.Header("X-Key"); v != "" {
		return "k:" + v, nil
	}
	return "", keyfunc.ErrNoKey
}

// rulesGlobalKey keys every request alike.
func rulesGlobalKey(keyfunc.Request) (string, error) { return "all", nil }

func TestRulesPathMatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		path    string
		want    bool
	}{
		{"", "/anything", true},
		{"/*", "/", true},
		{"/*", "/a/b/c", true},
		{"*", "/x", true},

		{"/api/*", "/api", true},
		{"/api/*", "/api/", true},
		{"/api/*", "/api/users", true},
		{"/api/*", "/api/users/42", true},
		{"/api/*", "/apix", false},
		{"/api/*", "/ap", false},
		{"/api/*", "/", false},
		{"/api/*", "/v2/api/x", false},

		{"/api", "/api", true},
		{"/api", "/api/", true},
		{"/api", "/api/users", false},

		// Cleaning: none of these may slip past the login rule.
		{"/api/login", "/api/login", true},
		{"/api/login", "/api//login", true},
		{"/api/login", "//api/login", true},
		{"/api/login", "/api/./login", true},
		{"/api/login", "/api/login/", true},
		{"/api/login", "/api/login/.", true},
		{"/api/login", "/api/x/../login", true},
		{"/api/login", "/api/../api/login", true},
		{"/api/login", "/../api/login", true},
		{"/api/login", "/api/login/x", false},
		{"/api/login", "/api/logins", false},
		{"/api/login", "/API/login", false}, // paths are case-sensitive, as in net/http

		{"/users/{id}/posts", "/users/42/posts", true},
		{"/users/{id}/posts", "/users/x/posts/", true},
		{"/users/{id}/posts", "/users/42/posts/7", false},
		{"/users/{id}/posts", "/users/posts", false},
		{"/users/{id}/posts", "/users//posts", false},
		{"/users/*/posts", "/users/42/posts", true},
		{"/users/*/posts", "/users/42/comments", false},
		{"/users/{id}/*", "/users/42", true},
		{"/users/{id}/*", "/users/42/posts/7", true},
		{"/users/{id}/*", "/users", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			lim, _ := newRulesLimiter(t, []middleware.Rule{{
				Name: "r", Path: tt.pattern, Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(10)},
			}})
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.URL.Path = tt.path // as the server decoded it, unclean
			res, err := lim.Decide(keyfunc.FromHTTP(r))
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != tt.want {
				t.Errorf("pattern %q, path %q: limited = %v, want %v", tt.pattern, tt.path, res.Applied, tt.want)
			}
		})
	}
}

func TestRulesBadPatterns(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"api", "/api/", "/api//x", "/api/./x", "/api/../x", "/api*", "/{id", "/a/{}/b", "/a/**"} {
		_, err := middleware.NewRules([]middleware.Rule{{
			Name: "r", Path: p, Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(1)},
		}})
		if err == nil {
			t.Errorf("NewRules accepted path %q", p)
		}
	}
}

func TestRulesMethodMatching(t *testing.T) {
	t.Parallel()
	tests := []struct {
		methods []string
		method  string
		want    bool
	}{
		{nil, http.MethodDelete, true},
		{[]string{"POST"}, http.MethodPost, true},
		{[]string{"post"}, http.MethodPost, true}, // rules may name methods in any case
		{[]string{"POST"}, http.MethodGet, false},
		{[]string{"GET", "PUT"}, http.MethodPut, true},
		{[]string{"GET", "PUT"}, http.MethodPatch, false},
		{[]string{"PURGE"}, "PURGE", true},
		{[]string{"PURGE"}, http.MethodGet, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.methods, ",")+" "+tt.method, func(t *testing.T) {
			t.Parallel()
			lim, _ := newRulesLimiter(t, []middleware.Rule{{
				Name: "r", Path: "/api/*", Methods: tt.methods, Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(10)},
			}})
			res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest(tt.method, "/api/x", nil)))
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != tt.want {
				t.Errorf("methods %v, request %s: limited = %v, want %v", tt.methods, tt.method, res.Applied, tt.want)
			}
		})
	}
}

// A rule for GET must also limit HEAD: net/http's ServeMux routes HEAD
// requests to GET handlers, which then do all their work.
func TestRulesGetCoversHead(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "r", Path: "/search", Methods: []string{"GET"}, Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(1)},
	}})
	res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest(http.MethodHead, "/search", nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Applied {
		t.Error("HEAD /search is not limited by a GET rule")
	}
}

// Every matching rule applies; the most restrictive one is reported, and
// RateLimit-Policy lists them all; a denied request is charged to none.
func TestRulesAllApplyAndDeniedChargesNone(t *testing.T) {
	t.Parallel()
	ip := keyfunc.RemoteIP()
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "api", Path: "/api/*", Key: ip, Limits: []middleware.Limit{middleware.PerMinute(10)}},
		{Name: "login", Path: "/api/login", Methods: []string{"POST"}, Key: ip, Limits: []middleware.Limit{middleware.PerMinute(2)}},
	})
	h := lim.Handler(rulesOK)
	const client = "192.0.2.1:1234"
	steps := []struct {
		method, path string
		code         int
		headers      string
	}{
		{"POST", "/api/login", 200, `X-RateLimit-Limit: 2
X-RateLimit-Remaining: 1
X-RateLimit-Reset: 120
RateLimit: "login";r=1;t=120
RateLimit-Policy: "api";q=10;w=60, "login";q=2;w=60
`},
		{"POST", "/api/login", 200, `X-RateLimit-Limit: 2
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 120
RateLimit: "login";r=0;t=90
RateLimit-Policy: "api";q=10;w=60, "login";q=2;w=60
`},
		// Denied by login: charged to neither login nor api. Retry-After
		// (and t, the wait for one unit) is when the two requests of this
		// window have decayed enough: 29.999 s into the next window.
		{"POST", "/api//login/", 429, `X-RateLimit-Limit: 2
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 120
RateLimit: "login";r=0;t=90
RateLimit-Policy: "api";q=10;w=60, "login";q=2;w=60
Retry-After: 90
`},
		{"POST", "/api/login", 429, `X-RateLimit-Limit: 2
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 120
RateLimit: "login";r=0;t=90
RateLimit-Policy: "api";q=10;w=60, "login";q=2;w=60
Retry-After: 90
`},
		// GET /api/login is not a login attempt; api has counted the two
		// admitted logins only, so this makes three.
		{"GET", "/api/login", 200, `X-RateLimit-Limit: 10
X-RateLimit-Remaining: 7
X-RateLimit-Reset: 120
RateLimit: "api";r=7;t=80
RateLimit-Policy: "api";q=10;w=60
`},
	}
	for i, s := range steps {
		rec := rulesServe(h, rulesReq(s.method, s.path, client))
		if rec.Code != s.code {
			t.Errorf("step %d: %s %s: status %d, want %d", i, s.method, s.path, rec.Code, s.code)
		}
		if got := rulesHeaders(rec.Header()); got != s.headers {
			t.Errorf("step %d: %s %s: headers\n%s\nwant\n%s", i, s.method, s.path, got, s.headers)
		}
	}
}

// A rule with several limits names each policy by rule and window.
func TestRulesSeveralLimits(t *testing.T) {
	t.Parallel()
	lim, clk := newRulesLimiter(t, []middleware.Rule{{
		Name: "burst", Key: rulesGlobalKey,
		Limits: []middleware.Limit{middleware.PerSecond(2), middleware.PerHour(3)},
	}})
	h := lim.Handler(rulesOK)
	want := []string{
		`X-RateLimit-Limit: 2
X-RateLimit-Remaining: 1
X-RateLimit-Reset: 2
RateLimit: "burst-1s";r=1;t=2
RateLimit-Policy: "burst-1s";q=2;w=1, "burst-1h";q=3;w=3600
`,
		`X-RateLimit-Limit: 2
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 2
RateLimit: "burst-1s";r=0;t=2
RateLimit-Policy: "burst-1s";q=2;w=1, "burst-1h";q=3;w=3600
`,
		// Two seconds later, the hour is the tighter limit.
		`X-RateLimit-Limit: 3
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 7198
RateLimit: "burst-1h";r=0;t=4798
RateLimit-Policy: "burst-1s";q=2;w=1, "burst-1h";q=3;w=3600
`,
	}
	for i, w := range want {
		if i == 2 {
			clk.Add(2 * time.Second)
		}
		rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1"))
		if rec.Code != 200 {
			t.Fatalf("request %d: status %d", i, rec.Code)
		}
		if got := rulesHeaders(rec.Header()); got != w {
			t.Errorf("request %d: headers\n%s\nwant\n%s", i, got, w)
		}
	}
	clk.Add(2 * time.Second)
	rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1"))
	if rec.Code != 429 || rec.Header().Get(headers.RateLimit) != `"burst-1h";r=0;t=4796` {
		t.Errorf("fourth request in the hour: status %d, RateLimit %q", rec.Code, rec.Header().Get(headers.RateLimit))
	}
}

func TestRulesFixedCost(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "upload", Key: rulesGlobalKey, Cost: 3, Limits: []middleware.Limit{middleware.PerMinute(10)},
	}})
	h := lim.Handler(rulesOK)
	for i, want := range []struct {
		code      int
		remaining string
	}{{200, "7"}, {200, "4"}, {200, "1"}, {429, "1"}} {
		rec := rulesServe(h, rulesReq("POST", "/", "192.0.2.1:1"))
		if rec.Code != want.code || rec.Header().Get(headers.Remaining) != want.remaining {
			t.Errorf("request %d: status %d, remaining %s; want %d, %s", i, rec.Code, rec.Header().Get(headers.Remaining), want.code, want.remaining)
		}
	}
}

func TestRulesCostExceedsLimit(t *testing.T) {
	t.Parallel()
	_, err := middleware.NewRules([]middleware.Rule{{
		Name: "big", Key: rulesGlobalKey, Cost: 11, Limits: []middleware.Limit{middleware.PerMinute(10)},
	}})
	const want = `sluice: rule "big": cost 11 exceeds limit 10/1m0s: no request could ever pass`
	if err == nil || err.Error() != want {
		t.Errorf("NewRules: %v, want %s", err, want)
	}
}

func TestRulesCostFunc(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "batch", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(10)},
		CostFunc: func(r keyfunc.Request) int {
			n, _ := strconv.Atoi(r.Header("X-Items"))
			return n
		},
	}})
	h := lim.Handler(rulesOK)
	steps := []struct {
		items      string
		code       int
		remaining  string
		retryAfter string
		body       string
	}{
		{"4", 200, "6", "", "ok"},
		{"", 200, "5", "", "ok"},   // no cost counts as 1
		{"-3", 200, "4", "", "ok"}, // nor does a negative one
		// More than the limit: 429 without Retry-After, since waiting would
		// not help, and nothing is charged.
		{"11", 429, "4", "", `{"error":"request cost exceeds the rate limit","policy":"batch","limit":10,"window_seconds":60}` + "\n"},
		{"5", 429, "4", "70", `{"error":"rate limit exceeded","policy":"batch","limit":10,"window_seconds":60,"retry_after_seconds":70}` + "\n"},
		{"4", 200, "0", "", "ok"},
	}
	for i, s := range steps {
		rec := rulesServe(h, rulesReq("POST", "/", "192.0.2.1:1", "X-Items", s.items))
		got := [4]string{strconv.Itoa(rec.Code), rec.Header().Get(headers.Remaining), rec.Header().Get(headers.RetryAfter), rec.Body.String()}
		want := [4]string{strconv.Itoa(s.code), s.remaining, s.retryAfter, s.body}
		if got != want {
			t.Errorf("step %d (cost %q): got %q, want %q", i, s.items, got, want)
		}
	}
}

func TestRulesPlans(t *testing.T) {
	t.Parallel()
	free := []middleware.Limit{middleware.PerMinute(2)}
	pro := []middleware.Limit{middleware.PerMinute(5)}
	plans := map[string][]middleware.Limit{"k:paid": pro}
	var lookups atomic.Int64
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "api", Key: rulesHeaderKey,
		LimitsFunc: func(r keyfunc.Request, key string) []middleware.Limit {
			lookups.Add(1)
			if l, ok := plans[key]; ok {
				return l
			}
			return free
		},
	}})
	h := lim.Handler(rulesOK)
	admitted := map[string]int{}
	for range 10 {
		for _, key := range []string{"cheap", "paid"} {
			rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1", "X-Key", key))
			if rec.Code == 200 {
				admitted[key]++
			}
		}
	}
	if admitted["cheap"] != 2 || admitted["paid"] != 5 {
		t.Errorf("admitted %v, want cheap 2 and paid 5", admitted)
	}
	if n := lookups.Load(); n != 20 {
		t.Errorf("LimitsFunc called %d times, want once per request (20)", n)
	}
	rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1", "X-Key", "paid"))
	const want = `X-RateLimit-Limit: 5
X-RateLimit-Remaining: 0
X-RateLimit-Reset: 120
RateLimit: "api";r=0;t=72
RateLimit-Policy: "api";q=5;w=60
Retry-After: 72
`
	if got := rulesHeaders(rec.Header()); got != want {
		t.Errorf("paid plan headers\n%s\nwant\n%s", got, want)
	}

	// An upgrade keeps the count of the windows both plans share.
	plans["k:cheap"] = pro // the test's goroutine is the only reader
	rec = rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1", "X-Key", "cheap"))
	if rec.Code != 200 || rec.Header().Get(headers.Remaining) != "2" {
		t.Errorf("after upgrade: status %d, remaining %s; want 200, 2", rec.Code, rec.Header().Get(headers.Remaining))
	}
}

// A LimitsFunc with two limits on one window would charge one counter
// twice; it should be an error for the request, as it is for Limits.
func TestRulesPlansDuplicateWindow(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "api", Key: rulesGlobalKey,
		LimitsFunc: func(keyfunc.Request, string) []middleware.Limit {
			return []middleware.Limit{middleware.PerMinute(10), middleware.PerMinute(20)}
		},
	}})
	if _, err := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", "/", "192.0.2.1:1"))); err == nil {
		t.Error("Decide accepted two limits with the same window")
	}
}

func TestRulesOverage(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "soft", Key: rulesGlobalKey, Overage: 0.1, Limits: []middleware.Limit{middleware.PerMinute(100)},
	}})
	h := lim.Handler(rulesOK)
	admitted := 0
	for i := 1; i <= 120; i++ {
		rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1"))
		if rec.Code == 200 {
			admitted++
		}
		hd := rec.Header()
		if hd.Get(headers.Limit) != "100" || hd.Get(headers.RateLimitPolicy) != `"soft";q=100;w=60` {
			t.Fatalf("request %d: limit %q, policy %q: the overage must not be advertised", i, hd.Get(headers.Limit), hd.Get(headers.RateLimitPolicy))
		}
		if want := strconv.Itoa(max(100-i, 0)); hd.Get(headers.Remaining) != want {
			t.Fatalf("request %d: remaining %q, want %s", i, hd.Get(headers.Remaining), want)
		}
	}
	if admitted != 110 {
		t.Errorf("admitted %d of 120, want 110 (100 plus 10%%)", admitted)
	}
}

// Overage is a fraction of the limit; floating-point error must not cost a
// request.
func TestRulesOverageRounding(t *testing.T) {
	t.Parallel()
	lim, _ := newRulesLimiter(t, []middleware.Rule{{
		Name: "soft", Key: rulesGlobalKey, Overage: 0.29, Limits: []middleware.Limit{middleware.PerMinute(100)},
	}})
	admitted := 0
	for range 140 {
		if res, _ := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", "/", "192.0.2.1:1"))); res.Allowed {
			admitted++
		}
	}
	if admitted != 129 {
		t.Errorf("admitted %d, want 129", admitted)
	}
}

func TestRulesAllowlist(t *testing.T) {
	t.Parallel()
	rule := middleware.Rule{
		Name: "api", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)},
		AllowKeys: []string{"ip:192.0.2.7"},
		AllowCIDRs: []netip.Prefix{
			netip.MustParsePrefix("198.51.100.0/24"),
			netip.MustParsePrefix("2001:db8:a::/48"),
			netip.MustParsePrefix("2001:db8:b:1::1/128"),
		},
	}
	joined := rule
	joined.Name, joined.Key = "joined", keyfunc.Join(keyfunc.Route(), keyfunc.RemoteIP())
	tests := []struct {
		remote string
		free   bool
		byKey  bool // allowlisted by AllowKeys, which match whole keys only
	}{
		{"192.0.2.7:1", true, true},
		{"192.0.2.8:1", false, false},            // a neighbour of an allowed key
		{"198.51.100.20:1", true, false},         // AllowCIDRs
		{"198.51.101.20:1", false, false},        // outside
		{"[2001:db8:a:5::9]:1", true, false},     // its /64 key lies inside the /48
		{"[2001:db8:b:1::1]:1", false, false},    // its key is the whole /64, not just the allowed /128
		{"[::ffff:198.51.100.3]:1", true, false}, // IPv4-mapped is keyed as IPv4
	}
	for _, r := range []middleware.Rule{rule, joined} {
		for _, tt := range tests {
			t.Run(r.Name+" "+tt.remote, func(t *testing.T) {
				t.Parallel()
				lim, _ := newRulesLimiter(t, []middleware.Rule{r})
				h := lim.Handler(rulesOK)
				free := tt.free && !(tt.byKey && r.Name == "joined")
				for i := range 3 {
					rec := rulesServe(h, rulesReq("GET", "/", tt.remote))
					if got := rec.Code == 200; got != (free || i == 0) {
						t.Fatalf("request %d: status %d, want allowlisted %v", i, rec.Code, free)
					}
					if free && rec.Header().Get(headers.Limit) != "" {
						t.Fatalf("allowlisted request got rate-limit headers: %v", rec.Header())
					}
				}
			})
		}
	}
}

func TestRulesSkip(t *testing.T) {
	t.Parallel()
	internal := func(r keyfunc.Request) bool { return r.Header("X-Internal") == "1" }
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "api", Key: rulesGlobalKey, Skip: internal, Limits: []middleware.Limit{middleware.PerMinute(1)}},
		{Name: "total", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(3)}},
	})
	h := lim.Handler(rulesOK)
	steps := []struct {
		internal string
		code     int
		policy   string
	}{
		{"", 200, `"api";q=1;w=60, "total";q=3;w=60`},
		{"", 429, `"api";q=1;w=60, "total";q=3;w=60`},
		{"1", 200, `"total";q=3;w=60`}, // api skipped, total still applies
		{"1", 200, `"total";q=3;w=60`},
		{"1", 429, `"total";q=3;w=60`},
	}
	for i, s := range steps {
		rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1", "X-Internal", s.internal))
		if rec.Code != s.code || rec.Header().Get(headers.RateLimitPolicy) != s.policy {
			t.Errorf("step %d: status %d, policy %q; want %d, %q", i, rec.Code, rec.Header().Get(headers.RateLimitPolicy), s.code, s.policy)
		}
	}
}

// rulesDecisions records what Observer.Decided reports.
type rulesDecisions struct {
	mu  sync.Mutex
	got []middleware.Result
}

func (d *rulesDecisions) record(_ keyfunc.Request, res *middleware.Result) {
	d.mu.Lock()
	d.got = append(d.got, *res)
	d.mu.Unlock()
}

func (d *rulesDecisions) take() []middleware.Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	got := d.got
	d.got = nil
	return got
}

func TestRulesShadowRule(t *testing.T) {
	t.Parallel()
	var dec rulesDecisions
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "trial", Key: rulesGlobalKey, Shadow: true, Limits: []middleware.Limit{middleware.PerMinute(2)}},
		{Name: "api", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(5)}},
	}, middleware.WithObserver(&middleware.Hooks{OnDecided: dec.record}))
	h := lim.Handler(rulesOK)
	for i := range 5 {
		rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1"))
		if rec.Code != 200 {
			t.Fatalf("request %d: status %d; the shadow rule must never deny", i, rec.Code)
		}
		// Headers describe the enforced rules only.
		if p := rec.Header().Get(headers.RateLimitPolicy); p != `"api";q=5;w=60` {
			t.Errorf("request %d: RateLimit-Policy %q", i, p)
		}
		got := dec.take()
		final := got[len(got)-1]
		if want := i >= 2; final.Shadowed != want || !final.Allowed {
			t.Errorf("request %d: reported allowed %v, shadowed %v; want true, %v", i, final.Allowed, final.Shadowed, want)
		}
	}
	if rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1")); rec.Code != 429 {
		t.Errorf("sixth request: status %d; the enforced rule must still deny", rec.Code)
	}
}

// What Observer.Decided reports about a shadow rule's own decision must say
// that it was shadowed, so a hook that counts denials does not count it.
func TestRulesShadowRuleReport(t *testing.T) {
	t.Parallel()
	var dec rulesDecisions
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "trial", Key: rulesGlobalKey, Shadow: true, Limits: []middleware.Limit{middleware.PerMinute(1)}},
	}, middleware.WithObserver(&middleware.Hooks{OnDecided: dec.record}))
	for range 2 {
		if _, err := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", "/", "192.0.2.1:1"))); err != nil {
			t.Fatal(err)
		}
	}
	for _, res := range dec.take() {
		if !res.Allowed || res.Policy == "trial" && !res.Shadowed {
			t.Errorf("reported %+v for a request that passed", res)
		}
	}
}

// A request denied by an enforced rule is charged to no rule, shadow rules
// included: otherwise a shadow rule counts requests that would never have
// reached it had it been enforced.
func TestRulesShadowNotChargedWhenDenied(t *testing.T) {
	t.Parallel()
	var dec rulesDecisions
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "login", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(1)}},
		{Name: "trial", Key: rulesGlobalKey, Shadow: true, Limits: []middleware.Limit{middleware.PerMinute(2)}},
	}, middleware.WithObserver(&middleware.Hooks{OnDecided: dec.record}))
	for range 5 {
		if _, err := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", "/", "192.0.2.1:1"))); err != nil {
			t.Fatal(err)
		}
	}
	for _, res := range dec.take() {
		if res.Shadowed {
			t.Errorf("the shadow rule saw 1 admitted request of its 2, yet reported %+v", res)
		}
	}
}

func TestRulesGlobalShadowMode(t *testing.T) {
	t.Parallel()
	var dec rulesDecisions
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "api", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(2)}},
	}, middleware.WithShadowMode(), middleware.WithObserver(&middleware.Hooks{OnDecided: dec.record}))
	h := lim.Handler(rulesOK)
	for i := range 4 {
		rec := rulesServe(h, rulesReq("GET", "/", "192.0.2.1:1"))
		if rec.Code != 200 || rec.Header().Get(headers.RetryAfter) != "" {
			t.Fatalf("request %d: status %d, Retry-After %q; shadow mode must never deny", i, rec.Code, rec.Header().Get(headers.RetryAfter))
		}
		got := dec.take()
		if len(got) != 1 {
			t.Fatalf("request %d: %d decisions reported, want 1", i, len(got))
		}
		if want := i >= 2; got[0].Shadowed != want || !got[0].Allowed || got[0].Policy != "api" {
			t.Errorf("request %d: reported %+v, want shadowed %v", i, got[0], want)
		}
	}
	// Shadowed requests were not counted: the limit's two admitted requests
	// are all there is.
	if res, _ := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", "/", "192.0.2.1:1"))); res.Remaining != 0 || !res.Shadowed {
		t.Errorf("after shadowed requests: %+v", res)
	}
}

func TestRulesSetRulesKeepsCounters(t *testing.T) {
	t.Parallel()
	key := rulesGlobalKey
	api := middleware.Rule{Name: "api", Path: "/api/*", Key: key, Limits: []middleware.Limit{middleware.PerMinute(10)}}
	other := middleware.Rule{Name: "other", Path: "/other", Key: key, Limits: []middleware.Limit{middleware.PerMinute(10)}}
	lim, _ := newRulesLimiter(t, []middleware.Rule{api, other})
	remaining := func(path string) int {
		t.Helper()
		res, err := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", path, "192.0.2.1:1")))
		if err != nil {
			t.Fatal(err)
		}
		return res.Remaining
	}
	for range 3 {
		remaining("/api/x")
	}

	// Another rule changes; api's counter carries on.
	other.Limits = []middleware.Limit{middleware.PerMinute(20)}
	if err := lim.SetRules([]middleware.Rule{api, other}); err != nil {
		t.Fatal(err)
	}
	if got := remaining("/api/x"); got != 6 {
		t.Errorf("unchanged rule after reload: remaining %d, want 6", got)
	}

	// A new limit on the same window keeps the count too.
	api.Limits = []middleware.Limit{middleware.PerMinute(20)}
	if err := lim.SetRules([]middleware.Rule{api, other}); err != nil {
		t.Fatal(err)
	}
	if got := remaining("/api/x"); got != 15 {
		t.Errorf("same window, new limit: remaining %d, want 15", got)
	}

	// Bad rules are rejected and the rules in force stay.
	bad := api
	bad.Cost = 50
	err := lim.SetRules([]middleware.Rule{bad, other})
	const want = `sluice: rule "api": cost 50 exceeds limit 20/1m0s: no request could ever pass`
	if err == nil || err.Error() != want {
		t.Errorf("SetRules(bad): %v, want %s", err, want)
	}
	if err := lim.SetRules(nil); err == nil {
		t.Error("SetRules(nil) succeeded")
	}
	if err := lim.SetRules([]middleware.Rule{api, api}); err == nil {
		t.Error("SetRules with a duplicate name succeeded")
	}
	if got := remaining("/api/x"); got != 14 {
		t.Errorf("after rejected reloads: remaining %d, want 14", got)
	}

	// A renamed rule starts afresh.
	api.Name = "api2"
	if err := lim.SetRules([]middleware.Rule{api, other}); err != nil {
		t.Fatal(err)
	}
	if got := remaining("/api/x"); got != 19 {
		t.Errorf("renamed rule: remaining %d, want 19", got)
	}
}

// Requests racing with reloads are each decided under one complete set of
// rules, and the counters of a rule kept across reloads are exact: with the
// clock frozen, exactly the limit is admitted in all.
func TestRulesConcurrentReload(t *testing.T) {
	t.Parallel()
	const limit, workers, perWorker = 50, 8, 25
	api := middleware.Rule{Name: "api", Path: "/api/*", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(limit)}}
	sets := [][]middleware.Rule{
		{api, {Name: "a", Path: "/api/*", Key: rulesGlobalKey, Limits: []middleware.Limit{middleware.PerMinute(1000)}}},
		{{Name: "b", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerHour(1000)}}, api},
		{api},
	}
	lim, _ := newRulesLimiter(t, sets[0])
	h := lim.Handler(rulesOK)

	var admitted, denied, other atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	reloads := 0
	var reloader sync.WaitGroup
	reloader.Add(1)
	go func() {
		defer reloader.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if err := lim.SetRules(sets[i%len(sets)]); err != nil {
				t.Error(err)
				return
			}
			reloads++
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				rec := rulesServe(h, rulesReq("GET", "/api/x", fmt.Sprintf("192.0.2.%d:1", w+1)))
				switch {
				case rec.Code == 200:
					admitted.Add(1)
				case rec.Code == 429:
					denied.Add(1)
				default:
					other.Add(1)
				}
				if rem, err := strconv.Atoi(rec.Header().Get(headers.Remaining)); err != nil || rem < 0 {
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	reloader.Wait()
	if admitted.Load() != limit || denied.Load() != workers*perWorker-limit || other.Load() != 0 {
		t.Errorf("admitted %d, denied %d, other %d; want %d, %d, 0 (after %d reloads)",
			admitted.Load(), denied.Load(), other.Load(), limit, workers*perWorker-limit, reloads)
	}
}
