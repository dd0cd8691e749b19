package config_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// loadEnvoy loads one of the samples of the Envoy ratelimit README.
func loadEnvoy(t *testing.T, name string, env config.Env) *config.Document {
	t.Helper()
	cfg, err := config.Load("testdata/envoy/"+name, env)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// sendN sends n copies of the request made by mk and returns the statuses
// in order, compressed as "200x5 429x1".
func sendN(h http.Handler, n int, mk func() *http.Request) string {
	var out []string
	last, count := 0, 0
	flush := func() {
		if count > 0 {
			out = append(out, strconv.Itoa(last)+"x"+strconv.Itoa(count))
		}
	}
	for range n {
		code := serve(h, mk()).Code
		if code != last {
			flush()
			last, count = code, 0
		}
		count++
	}
	flush()
	return strings.Join(out, " ")
}

// TestEnvoyExample3 loads the README's Example 3: every address gets 10
// requests a second, and 50.0.0.5, which has a more specific entry with 0,
// gets none.
func TestEnvoyExample3(t *testing.T) {
	t.Parallel()
	cfg := loadEnvoy(t, "example3_per_ip.yaml", config.Env{})
	if cfg.Domain != "edge_proxy_per_ip" || len(cfg.Rules) != 2 {
		t.Fatalf("domain %q, %d rules", cfg.Domain, len(cfg.Rules))
	}
	lim, clk := limiter(t, cfg)
	h := lim.Handler(okHandler)
	from := func(addr string) func() *http.Request {
		return func() *http.Request { return request("GET", "/", addr+":1234") }
	}
	if got, want := sendN(h, 12, from("50.0.0.1")), "200x10 429x2"; got != want {
		t.Errorf("50.0.0.1: %s, want %s", got, want)
	}
	if got, want := sendN(h, 3, from("50.0.0.2")), "200x3"; got != want {
		t.Errorf("50.0.0.2: %s, want %s", got, want)
	}
	rec := serve(h, from("50.0.0.5")())
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "denied by rule") {
		t.Errorf("50.0.0.5: %d %s, want 429 denied by rule", rec.Code, rec.Body)
	}
	// A fixed window of one second, as Envoy counts: the next second
	// admits 10 again, and 50.0.0.5 still none.
	clk.Add(time.Second)
	if got, want := sendN(h, 11, from("50.0.0.1")), "200x10 429x1"; got != want {
		t.Errorf("50.0.0.1, next second: %s, want %s", got, want)
	}
	if got, want := sendN(h, 2, from("50.0.0.5")), "429x2"; got != want {
		t.Errorf("50.0.0.5, next second: %s, want %s", got, want)
	}
}

// TestEnvoyExample2 loads the README's Example 2: each phone number gets 5
// marketing messages a day, and 100 messages of any type. Envoy takes the
// descriptor keys from headers (its request_headers action); here
// Env.DescriptorHeaders does the same.
func TestEnvoyExample2(t *testing.T) {
	t.Parallel()
	env := config.Env{DescriptorHeaders: map[string]string{"message_type": "X-Message-Type", "to_number": "X-To-Number"}}
	cfg := loadEnvoy(t, "example2_messaging.yaml", env)
	var names []string
	for _, r := range cfg.Rules {
		names = append(names, r.Name)
	}
	if got, want := strings.Join(names, " "), "messaging.message_type_marketing.to_number messaging.to_number"; got != want {
		t.Errorf("rules %s, want %s", got, want)
	}
	lim, clk := limiter(t, cfg)
	h := lim.Handler(okHandler)
	msg := func(typ, to string) func() *http.Request {
		return func() *http.Request {
			hdr := []string{"X-To-Number", to}
			if typ != "" {
				hdr = append(hdr, "X-Message-Type", typ)
			}
			return request("POST", "/messages", "192.0.2.1:1", hdr...)
		}
	}
	if got, want := sendN(h, 6, msg("marketing", "2061111111")), "200x5 429x1"; got != want {
		t.Errorf("marketing to 2061111111: %s, want %s", got, want)
	}
	if got, want := sendN(h, 5, msg("marketing", "2062222222")), "200x5"; got != want {
		t.Errorf("marketing to 2062222222: %s, want %s", got, want)
	}
	// The five admitted marketing messages count towards the 100 too (a
	// denied request is charged to no rule).
	if got, want := sendN(h, 96, msg("", "2061111111")), "200x95 429x1"; got != want {
		t.Errorf("other messages to 2061111111: %s, want %s", got, want)
	}
	if got, want := sendN(h, 1, msg("transactional", "2062222222")), "200x1"; got != want {
		t.Errorf("transactional to 2062222222: %s, want %s", got, want)
	}
	// A request without a phone number has no descriptor that applies.
	if got := serve(h, request("POST", "/messages", "192.0.2.1:1", "X-Message-Type", "marketing")).Code; got != http.StatusOK {
		t.Errorf("no number: %d", got)
	}
	clk.Add(24 * time.Hour)
	if got, want := sendN(h, 1, msg("marketing", "2061111111")), "200x1"; got != want {
		t.Errorf("next day: %s, want %s", got, want)
	}
}

// TestDescriptors covers what the samples do not: built-in keys, shadow
// mode, unlimited and allowlisted entries, wildcards, replaces, the
// unmatched setting and combinations keyed by every level.
func TestDescriptors(t *testing.T) {
	t.Parallel()
	src := `
domain: api
unmatched: deny
descriptors:
  - key: header:X-Tenant
    value: internal
  - key: header:X-Tenant
    value: "gold*"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: header:X-Tenant
    rate_limit: {unit: minute, requests_per_unit: 1, name: tenant_default}
    descriptors:
      - key: path
        value: /search
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, unlimited: false}
  - key: query:plan
    value: free
    descriptors:
      - key: method
        value: POST
        rate_limit:
          unit: second
          requests_per_unit: 1
          replaces: [{name: tenant_default}]
  - key: api_key
    rate_limit: {unlimited: true}
`
	cfg := mustParse(t, src, testEnv())
	if !cfg.UnmatchedSet || cfg.Unmatched != middleware.UnmatchedDeny {
		t.Fatalf("unmatched %v %v", cfg.UnmatchedSet, cfg.Unmatched)
	}
	lim, _ := limiter(t, cfg)
	h := lim.Handler(okHandler)
	tenant := func(v string, extra ...string) func() *http.Request {
		return func() *http.Request {
			return request("GET", "/items", "192.0.2.1:1", append([]string{"X-Tenant", v}, extra...)...)
		}
	}
	for _, tc := range []struct {
		name string
		n    int
		mk   func() *http.Request
		want string
	}{
		{"allowlisted value", 3, tenant("internal"), "200x3"},
		{"wildcard, per value", 4, tenant("gold-1"), "200x3 429x1"},
		{"wildcard, another value", 3, tenant("gold-2"), "200x3"},
		{"key alone", 2, tenant("acme"), "200x1 429x1"},
		{"key alone, another value", 1, tenant("zeta"), "200x1"},
		// Shadow: the nested rule would deny the second, which passes.
		{"nested shadow", 2, func() *http.Request { return request("GET", "/search", "192.0.2.1:1", "X-Tenant", "beta") }, "200x1 429x1"},
		{"user", 3, func() *http.Request { return withUser(request("GET", "/", "192.0.2.1:1"), "ann") }, "200x2 429x1"},
		{"unlimited api key", 5, func() *http.Request { return request("GET", "/", "192.0.2.1:1", "X-API-Key", "k1") }, "200x5"},
		{"unmatched", 1, func() *http.Request { return request("GET", "/", "192.0.2.1:1") }, "503x1"},
		// tenant_default gives way to the query rule that replaces it.
		{"replaces", 3, func() *http.Request { return request("POST", "/items?plan=free", "192.0.2.1:1", "X-Tenant", "omega") }, "200x1 429x2"},
	} {
		if got := sendN(h, tc.n, tc.mk); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestDescriptorErrors checks that mistakes in descriptor files name the
// file, the line and the field.
func TestDescriptorErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ src, want string }{
		{"domain: a\n", "rules.yaml:1: descriptors: required"},
		{"domain: a\ndescriptors: []\n", "rules.yaml:2: descriptors: empty"},
		{"domain: a\ndescriptors:\n  - key: to\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`rules.yaml:3: descriptors[0].key: unknown descriptor key "to"`},
		{"domain: a\ndescriptors:\n  - key: method\n    rate_limit: {unit: week, requests_per_unit: 1}\n",
			`rules.yaml:4: descriptors[0].rate_limit.unit: unknown unit "week"`},
		{"domain: a\ndescriptors:\n  - key: method\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`rules.yaml:4: descriptors[0].rate_limit.requests_per_unit: -1 must not be negative`},
		{"domain: a\ndescriptors:\n  - key: method\n    rate_limit: {unit: second}\n",
			`rules.yaml:4: descriptors[0].rate_limit.requests_per_unit: required`},
		{"domain: a\ndescriptors:\n  - key: method\n    rate_limit: {unlimited: true, unit: second}\n",
			`rules.yaml:4: descriptors[0].rate_limit: unlimited: true takes no unit`},
		{"domain: a\ndescriptors:\n  - key: remote_address\n    value: nope\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`rules.yaml:4: descriptors[0].value: bad remote_address "nope"`},
		{"domain: a\ndescriptors:\n  - key: method\n  - key: method\n",
			`rules.yaml:4: descriptors[1].key: key "method" without a value defined twice at this level (first at line 3)`},
		{"domain: a\ndescriptors:\n  - key: method\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n",
			`rules.yaml:4: replaces: no rate_limit is named "x"`},
		{"domain: a\ndescriptors:\n  - key: method\n    ratelimit: {}\n",
			`rules.yaml:4: descriptors[0].ratelimit: unknown field`},
		{"domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`rules.yaml:3: descriptors[0].key: user needs Env.User`},
		{"domain: a\ndescriptors:\n  - key: method\n    usage: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`rules.yaml:3: descriptors[0].usage: applies to the rate limit service only`},
	} {
		_, err := config.Parse([]byte(tc.src), "rules.yaml", config.Env{})
		var e *config.Error
		if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q:\n got  %v\n want %s...", tc.src, err, tc.want)
		}
	}
}

// TestMatchHeadersQuery checks match.headers and match.query in a file of
// rules.
func TestMatchHeadersQuery(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, `
unmatched: deny
rules:
  - name: gold
    match: {path: /api/*, headers: {x-tenant: gold}, query: {plan: free}}
    key: ip
    limits: [{requests: 1, window: 1m}]
  - name: rest
    match: {path: /api/*}
    key: ip
    limits: [{requests: 100, window: 1m}]
`, config.Env{})
	if r := cfg.Rules[0]; r.Headers["x-tenant"] != "gold" || r.Query["plan"] != "free" {
		t.Fatalf("rule %+v", r)
	}
	lim, _ := limiter(t, cfg)
	h := lim.Handler(okHandler)
	gold := func() *http.Request { return request("GET", "/api/x?plan=free", "192.0.2.1:1", "X-Tenant", "gold") }
	if got, want := sendN(h, 2, gold), "200x1 429x1"; got != want {
		t.Errorf("gold free: %s, want %s", got, want)
	}
	other := func() *http.Request { return request("GET", "/api/x?plan=pro", "192.0.2.1:1", "X-Tenant", "gold") }
	if got, want := sendN(h, 2, other), "200x2"; got != want {
		t.Errorf("gold pro: %s, want %s", got, want)
	}
	if got := serve(h, request("GET", "/elsewhere", "192.0.2.1:1")).Code; got != http.StatusServiceUnavailable {
		t.Errorf("unmatched: %d, want 503", got)
	}
	for _, tc := range []struct{ src, want string }{
		{"rules: [{name: a, key: ip, limits: [{requests: 1, window: 1s}], match: {headers: {\"bad header\": x}}}]",
			`rules.yaml:1: rules[0].match.headers.bad header: bad header name`},
		{"rules: [{name: a, key: ip, limits: [{requests: 1, window: 1s}], match: {query: []}}]",
			`rules.yaml:1: rules[0].match.query: want a mapping`},
		{"unmatched: maybe\nrules: [{name: a, key: ip, limits: [{requests: 1, window: 1s}]}]",
			`rules.yaml:1: unmatched: unknown policy "maybe"`},
	} {
		if _, err := config.Parse([]byte(tc.src), "rules.yaml", config.Env{}); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q:\n got  %v\n want %s...", tc.src, err, tc.want)
		}
	}
}

// TestDescriptorUsage: usage: true marks a budget of the rate limit
// service charged after the fact, and needs a limit to charge.
func TestDescriptorUsage(t *testing.T) {
	t.Parallel()
	env := config.Env{RateLimitService: true}
	cfg, err := config.Parse([]byte("domain: llm\ndescriptors:\n  - key: api_key\n    usage: true\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"), "rls.yaml", env)
	if err != nil || !cfg.Usage {
		t.Fatalf("usage descriptor: %v, Usage %v", err, cfg != nil && cfg.Usage)
	}
	for _, src := range []string{
		"domain: llm\ndescriptors:\n  - key: api_key\n    usage: true\n    rate_limit: {unlimited: true}\n",
		"domain: llm\ndescriptors:\n  - key: api_key\n    usage: true\n    rate_limit: {unit: minute, requests_per_unit: 0}\n",
	} {
		if _, err := config.Parse([]byte(src), "rls.yaml", env); err == nil || !strings.Contains(err.Error(), "descriptors[0].usage: needs a rate_limit with requests_per_unit") {
			t.Errorf("%q: %v", src, err)
		}
	}
}
