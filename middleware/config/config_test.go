package config_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// t0 is the start of a minute and of an hour.
var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// newClock returns a fake clock frozen at t0.
func newClock() *testclock.Clock { return testclock.New(t0) }

// userKey is where the tests' authentication stores the user.
type userKey struct{}

// userFrom returns the user stored by withUser.
func userFrom(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok
}

// withUser authenticates r as user.
func withUser(r *http.Request, user string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), userKey{}, user))
}

// testEnv is an Env with every hook set: users come from the context and
// plans from the X-Plan header.
func testEnv() config.Env {
	return config.Env{
		User: userFrom,
		Plan: func(r keyfunc.Request, _ string) string { return r.Header("X-Plan") },
	}
}

// request builds a request from remote with headers given as name, value
// pairs.
func request(method, target, remote string, hdr ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return r
}

// serve sends r through h.
func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })

// limiter builds a Limiter from cfg on a frozen clock.
func limiter(t *testing.T, cfg *config.Document, opts ...middleware.Option) (*middleware.Limiter, *testclock.Clock) {
	t.Helper()
	clk := newClock()
	lim, err := middleware.NewRules(cfg.Rules, append(append(cfg.Options(), middleware.WithClock(clk.Now)), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim, clk
}

// mustParse parses a file that must load.
func mustParse(t *testing.T, src string, env config.Env) *config.Document {
	t.Helper()
	cfg, err := config.Parse([]byte(src), "rules.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestParseErrors checks that every kind of mistake is rejected with the
// file, the line and the field.
func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		bareEnv bool // parse with the zero Env
		in      string
		want    string
	}{
		{
			name: "unknown top-level field",
			in:   "rulez: []",
			want: `rules.yaml:1: rulez: unknown field (want rules, headers, shadow, allow, unmatched)
rules.yaml:1: rules: required`,
		},
		{
			name: "bad duration",
			in: `rules:
  - name: api
    match: {path: "/api/*"}
    key: ip
    limits: [{requests: 100, window: 1m}]
  - name: login
    limits: [{requests: 5, window: 5x}]
    key: ip`,
			want: `rules.yaml:7: rules[1].limits[0].window: bad duration "5x"`,
		},
		{
			name: "top_clients of 1",
			in:   "rules: [{name: a, key: ip, top_clients: 1, limits: [{requests: 1, window: 1s}]}]",
			want: `rules.yaml:1: rules[0].top_clients: 1: want -1 (no top clients), or 2 to 10000 counters`,
		},
		{
			name: "window zero",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 0s}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: duration "0s" must be positive`,
		},
		{
			name: "window negative",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: -1m}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: duration "-1m" must be positive`,
		},
		{
			name: "window sub-ms",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1.5ms}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: duration "1.5ms" is not a whole number of milliseconds`,
		},
		{
			name: "window number",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 60}]}]",
			want: "rules.yaml:1: rules[0].limits[0].window: bad duration 60: want a unit, as in 60s",
		},
		{
			name: "window list",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: [1m]}]}]",
			want: "rules.yaml:1: rules[0].limits[0].window: want a duration such as 1m, got a list",
		},
		{
			name: "window too many days",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 999999999d}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: bad duration "999999999d": too long`,
		},
		{
			name: "requests zero",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 0, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: 0 must be at least 1",
		},
		{
			name: "requests quoted",
			in:   `rules: [{name: a, key: ip, limits: [{requests: "100", window: 1m}]}]`,
			want: `rules.yaml:1: rules[0].limits[0].requests: want an integer, got "100"`,
		},
		{
			name: "requests float",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1.5, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: want an integer, got number 1.5",
		},
		{
			name: "requests huge",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 99999999999999999999, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: want an integer, got number 99999999999999999999",
		},
		{
			name: "requests too large",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1125899906842625, window: 1d}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: requests 1125899906842625 must be at most 2^50 (1125899906842624)",
		},
		{
			name: "window too long",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 523w}]}]",
			want: "rules.yaml:1: rules[0].limits[0].window: window 523w must be at most 3660d",
		},
		{
			name: "weeks not whole",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1.5w}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: bad duration "1.5w"`,
		},
		{
			name: "weeks too many",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 99999999999999999999w}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: bad duration "99999999999999999999w": too long`,
		},
		{
			name: "requests missing",
			in:   "rules: [{name: a, key: ip, limits: [{window: 1m}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: required",
		},
		{
			name: "limits missing",
			in:   "rules: [{name: a, key: ip}]",
			want: "rules.yaml:1: rules[0].limits: required (the limits of the default plan when the rule has plans), unless the rule has a concurrency limit or usage limits",
		},
		{
			name: "limits empty",
			in:   "rules: [{name: a, key: ip, limits: []}]",
			want: "rules.yaml:1: rules[0].limits: empty: want at least one {requests: N, window: D}",
		},
		{
			name: "limit not mapping",
			in:   "rules: [{name: a, key: ip, limits: [100/1m]}]",
			want: `rules.yaml:1: rules[0].limits[0]: want a mapping such as {requests: 100, window: 1m}, got "100/1m"`,
		},
		{
			name: "limits duplicate window",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}, {requests: 2, window: 60s}]}]",
			want: "rules.yaml:1: rules[0].limits[1].window: 1m used twice (first at line 1): one limit per window",
		},
		{
			name: "limits duplicate window in days",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1d}, {requests: 2, window: 24h}]}]",
			want: "rules.yaml:1: rules[0].limits[1].window: 1d used twice (first at line 1): one limit per window",
		},
		{
			name: "limit unknown field",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m, bursts: 3}]}]",
			want: "rules.yaml:1: rules[0].limits[0].bursts: unknown field (want requests, window, algorithm, burst, max_delay, time_zone, max_log, ceiling, ban)",
		},
		{
			name: "cost zero",
			in:   "rules: [{name: a, key: ip, cost: 0, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].cost: 0 must be at least 1",
		},
		{
			name: "cost exceeds",
			in: `rules:
  - name: a
    key: ip
    cost: 5
    limits: [{requests: 10, window: 1h}, {requests: 4, window: 1m}]`,
			want: "rules.yaml:4: rules[0].cost: 5 exceeds rules[0].limits[1] (4 per 1m): no request could ever pass",
		},
		{
			name: "cost exceeds plan",
			in: `rules:
  - name: a
    key: ip
    cost: 5
    limits: [{requests: 10, window: 1h}]
    plans:
      tiny: [{requests: 2, window: 1h}]`,
			want: "rules.yaml:4: rules[0].cost: 5 exceeds rules[0].plans.tiny[0] (2 per 1h): no request could ever pass",
		},
		{
			name: "unknown key",
			in:   "rules: [{name: a, key: usr_id, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].key: unknown key name "usr_id" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)`,
		},
		{
			name:    "user_id without Env.User",
			bareEnv: true,
			in:      "rules: [{name: a, key: user_id, limits: [{requests: 1, window: 1m}]}]",
			want:    "rules.yaml:1: rules[0].key: user_id needs Env.User, which the program did not supply",
		},
		{
			name:    "user_or_ip without Env.User",
			bareEnv: true,
			in:      "rules: [{name: a, key: user_or_ip, limits: [{requests: 1, window: 1m}]}]",
			want:    "rules.yaml:1: rules[0].key: user_or_ip needs Env.User, which the program did not supply",
		},
		{
			name:    "plans without Env.Plan",
			bareEnv: true,
			in:      "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], plans: {pro: [{requests: 5, window: 1m}]}}]",
			want:    "rules.yaml:1: rules[0].plans: the program supplies no Env.Plan to choose a plan",
		},
		{
			name: "bad header name",
			in:   `rules: [{name: a, key: "header:X Tenant", limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: rules[0].key: "header:X Tenant": bad header name "X Tenant"`,
		},
		{
			name: "empty header name",
			in:   `rules: [{name: a, key: "header:", limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: rules[0].key: "header:": bad header name ""`,
		},
		{
			name: "key twice",
			in:   "rules: [{name: a, key: ip+route+ip, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].key: "ip+route+ip" names ip twice`,
		},
		{
			name: "key empty part",
			in:   "rules: [{name: a, key: ip+, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].key: "ip+": empty name next to + or |`,
		},
		{
			name: "key empty",
			in:   `rules: [{name: a, key: "", limits: [{requests: 1, window: 1m}]}]`,
			want: "rules.yaml:1: rules[0].key: empty: want a key name such as ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip",
		},
		{
			name: "key number",
			in:   "rules: [{name: a, key: 5, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].key: unknown key name "5" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)`,
		},
		{
			name: "key missing",
			in:   "rules: [{name: a, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].key: required",
		},
		{
			name: "name missing",
			in:   "rules: [{key: ip, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].name: required",
		},
		{
			name: "name bad",
			in:   `rules: [{name: "my rule", key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: rules[0].name: bad name "my rule": want 1 to 64 of A-Z a-z 0-9 _ . -`,
		},
		{
			name: "duplicate names",
			in: `rules:
  - {name: a, key: ip, limits: [{requests: 1, window: 1m}]}
  - {name: b, key: ip, limits: [{requests: 1, window: 1m}]}
  - {name: a, key: ip, limits: [{requests: 1, window: 1m}]}`,
			want: `rules.yaml:4: rules[2].name: "a" used twice (first at line 2)`,
		},
		{
			name: "rules empty",
			in:   "rules: []",
			want: "rules.yaml:1: rules: empty: want at least one rule",
		},
		{
			name: "rules missing",
			in:   "headers: both",
			want: "rules.yaml:1: rules: required",
		},
		{
			name: "rules not list",
			in:   "rules: {name: a}",
			want: "rules.yaml:1: rules: want a list, got a mapping",
		},
		{
			name: "rule not mapping",
			in:   "rules: [api]",
			want: `rules.yaml:1: rules[0]: want a mapping, got "api"`,
		},
		{
			name: "bad CIDR",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], allow: {cidrs: [10.0.0.0/33]}}]",
			want: `rules.yaml:1: rules[0].allow.cidrs[0]: bad CIDR "10.0.0.0/33"`,
		},
		{
			name: "CIDR host bits",
			in: `allow: {cidrs: [10.1.2.3/8]}
rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: allow.cidrs[0]: CIDR "10.1.2.3/8" has host bits set: write 10.0.0.0/8, or 10.1.2.3/32 for the one address`,
		},
		{
			name: "CIDR zone",
			in: `allow: {cidrs: ["fe80::1%eth0"]}
rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: allow.cidrs[0]: bad CIDR "fe80::1%eth0": want a network such as 203.0.113.0/24 or an address`,
		},
		{
			name: "CIDR mapped",
			in: `allow: {cidrs: ["::ffff:10.0.0.0/104"]}
rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: allow.cidrs[0]: CIDR "::ffff:10.0.0.0/104" is IPv4-mapped: clients are keyed by their IPv4 address, so write the IPv4 network`,
		},
		{
			name: "CIDRs without address",
			in:   "rules: [{name: a, key: user_id, limits: [{requests: 1, window: 1m}], allow: {cidrs: [10.0.0.0/8]}}]",
			want: `rules.yaml:1: rules[0].allow.cidrs: key "user_id" has no address to check the CIDRs against`,
		},
		{
			name: "allow keys empty",
			in:   `rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], allow: {keys: [""]}}]`,
			want: "rules.yaml:1: rules[0].allow.keys[0]: empty key",
		},
		{
			name: "allow unknown field",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], allow: {ips: [10.0.0.1]}}]",
			want: "rules.yaml:1: rules[0].allow.ips: unknown field (want cidrs, keys)",
		},
		{
			name: "unknown method",
			in:   "rules: [{name: a, key: ip, match: {methods: [GTE]}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.methods[0]: unknown method "GTE" (want GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS, TRACE)`,
		},
		{
			name: "method twice",
			in:   "rules: [{name: a, key: ip, match: {methods: [get, GET]}, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].match.methods[1]: GET listed twice",
		},
		{
			name: "methods empty",
			in:   "rules: [{name: a, key: ip, match: {methods: []}, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].match.methods: empty: leave methods out to match every method",
		},
		{
			name: "methods string",
			in:   "rules: [{name: a, key: ip, match: {methods: GET}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.methods: want a list, got "GET"`,
		},
		{
			name: "path without slash",
			in:   "rules: [{name: a, key: ip, match: {path: api/*}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.path: "api/*" must start with /`,
		},
		{
			name: "path trailing slash",
			in:   "rules: [{name: a, key: ip, match: {path: /api/}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.path: "/api/" has an empty segment: requests are matched by their cleaned path, without doubled or trailing slashes`,
		},
		{
			name: "path dot-dot",
			in:   "rules: [{name: a, key: ip, match: {path: /api/../x}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.path: "/api/../x" has a ".." segment: requests are matched by their cleaned path, without dot segments`,
		},
		{
			name: "path star inside",
			in:   "rules: [{name: a, key: ip, match: {path: /api*}, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].match.path: "/api*": bad segment "api*": * and {name} stand for whole segments`,
		},
		{
			name: "match unknown field",
			in:   "rules: [{name: a, key: ip, match: {host: example.com}, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].match.host: unknown field (want path, methods, headers, query)",
		},
		{
			name: "headers bogus",
			in: `headers: fancy
rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: headers: unknown style "fancy" (want both, legacy, draft or none)`,
		},
		{
			name: "shadow yes",
			in: `shadow: yes
rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]`,
			want: `rules.yaml:1: shadow: want true or false, got "yes"`,
		},
		{
			name: "overage too large",
			in:   "rules: [{name: a, key: ip, overage: 11, limits: [{requests: 1, window: 1m}]}]",
			want: "rules.yaml:1: rules[0].overage: 11 must be between 0 and 10 (a fraction: 0.1 admits 10% more)",
		},
		{
			name: "overage percent",
			in:   "rules: [{name: a, key: ip, overage: 10%, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].overage: want a number, got "10%"`,
		},
		{
			name: "overage too large for limit",
			in:   "rules: [{name: a, key: ip, overage: 1, limits: [{requests: 1000000000000000, window: 1000d}]}]",
			want: "rules.yaml:1: rules[0].overage: 1 makes rules[0].limits[0] too large: limit 2000000000000000/24000h0m0s: requests 2000000000000000 must be at most 2^50 (1125899906842624)",
		},
		{
			name: "algorithm unknown",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m, algorithm: leaky}]}]",
			want: `rules.yaml:1: rules[0].limits[0].algorithm: unknown algorithm "leaky" (want sliding_window, fixed_window, sliding_log, token_bucket or leaky_bucket)`,
		},
		{
			name: "rule algorithm unknown",
			in:   "rules: [{name: a, key: ip, algorithm: gcra, limits: [{requests: 1, window: 1m}]}]",
			want: `rules.yaml:1: rules[0].algorithm: unknown algorithm "gcra" (want sliding_window, fixed_window, sliding_log, token_bucket or leaky_bucket)`,
		},
		{
			name: "burst without token bucket",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m, burst: 3}]}]",
			want: "rules.yaml:1: rules[0].limits[0].burst: burst applies only to the token_bucket and leaky_bucket algorithms, not to sliding_window",
		},
		{
			name: "burst zero",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m, algorithm: token_bucket, burst: 0}]}]",
			want: "rules.yaml:1: rules[0].limits[0].burst: 0 must be at least 1",
		},
		{
			name: "calendar period unknown",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: calendar_year}]}]",
			want: `rules.yaml:1: rules[0].limits[0].window: unknown calendar period "calendar_year": want calendar_day, calendar_week or calendar_month`,
		},
		{
			name: "calendar with token bucket",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: calendar_day, algorithm: token_bucket}]}]",
			want: "rules.yaml:1: rules[0].limits[0].algorithm: token_bucket cannot count a calendar period (calendar_day): calendar periods need fixed_window",
		},
		{
			name: "time zone unknown",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: calendar_day, time_zone: Mars/Olympus}]}]",
			want: `rules.yaml:1: rules[0].limits[0].time_zone: unknown time zone "Mars/Olympus" (want an IANA name such as Europe/Paris)`,
		},
		{
			name: "time zone on a duration",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1d, time_zone: Europe/Paris}]}]",
			want: "rules.yaml:1: rules[0].limits[0].time_zone: a time zone applies only to a calendar period (calendar_day, calendar_week or calendar_month), not to a window of 1d",
		},
		{
			name: "rule time zone unused",
			in:   "rules: [{name: a, key: ip, time_zone: Europe/Paris, limits: [{requests: 1, window: 1d}]}]",
			want: "rules.yaml:1: rules[0].time_zone: no limit of the rule has a calendar window (calendar_day, calendar_week or calendar_month)",
		},
		{
			name: "calendar window twice",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: calendar_day}, {requests: 2, window: calendar_day, time_zone: UTC}]}]",
			want: "rules.yaml:1: rules[0].limits[1].window: calendar_day used twice (first at line 1): one limit per window",
		},
		{
			name: "sliding log too long",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 5000, window: 1h, algorithm: sliding_log}]}]",
			want: "rules.yaml:1: rules[0].limits[0].requests: a sliding log keeps one entry per request, and 5000 requests is above its maximum of 1000; raise max_log (up to 100000) to accept the memory it costs, or use another algorithm",
		},
		{
			name: "max log too large",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 5000, window: 1h, algorithm: sliding_log, max_log: 200000}]}]",
			want: "rules.yaml:1: rules[0].limits[0].max_log: max_log 200000 must be between 1 and 100000, or 0 for 1000",
		},
		{
			name: "max log without sliding log",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 5, window: 1h, max_log: 10}]}]",
			want: "rules.yaml:1: rules[0].limits[0].max_log: max_log applies only to the sliding_log algorithm, not to sliding_window",
		},
		{
			name: "cost above burst",
			in:   "rules: [{name: a, key: ip, cost: 5, limits: [{requests: 10, window: 1s, algorithm: token_bucket, burst: 4}]}]",
			want: "rules.yaml:1: rules[0].cost: 5 exceeds rules[0].limits[0] (10 per 1s (token_bucket, burst 4)): no request could ever pass",
		},
		{
			name: "plans empty",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], plans: {}}]",
			want: "rules.yaml:1: rules[0].plans: empty: leave plans out when the rule has none",
		},
		{
			name: "plan bad name",
			in:   `rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], plans: {"pro plan": [{requests: 5, window: 1m}]}}]`,
			want: `rules.yaml:1: rules[0].plans.pro plan: bad plan name "pro plan": want 1 to 64 of A-Z a-z 0-9 _ . -`,
		},
		{
			name: "plan duplicate window",
			in:   "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}], plans: {pro: [{requests: 5, window: 1m}, {requests: 6, window: 1m}]}}]",
			want: "rules.yaml:1: rules[0].plans.pro[1].window: 1m used twice (first at line 1): one limit per window",
		},
		{
			name: "duplicate key",
			in: `rules:
  - name: a
    key: ip
    key: route
    limits: [{requests: 1, window: 1m}]`,
			want: "rules.yaml:4: rules[0].key: defined twice (first at line 3)",
		},
		{
			name: "merge key",
			in: `base: &base {key: ip, limits: [{requests: 1, window: 1m}]}
rules:
  - <<: *base
    name: a`,
			want: `rules.yaml:1: base: unknown field (want rules, headers, shadow, allow, unmatched)
rules.yaml:3: rules[0].<<: merge keys are not supported`,
		},
		{
			name: "syntax error",
			in: `rules:
  - name: a
   key: ip`,
			want: "rules.yaml:3: did not find expected '-' indicator",
		},
		{
			name: "tab",
			in:   "rules:\n\t- name: a",
			want: "rules.yaml:2: found character that cannot start any token",
		},
		{
			name: "two documents",
			in: `rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]
---
rules: []`,
			want: "rules.yaml:2: more than one YAML document",
		},
		{
			name: "empty",
			in:   "",
			want: "rules.yaml:1: empty file: want a mapping with rules",
		},
		{
			name: "comments only",
			in:   "# nothing here",
			want: "rules.yaml:1: empty file: want a mapping with rules",
		},
		{
			name: "not a mapping",
			in:   "- name: a",
			want: "rules.yaml:1: want a mapping with rules, got a list",
		},
		{
			name: "null document",
			in:   "~",
			want: "rules.yaml:1: want a mapping with rules, got nothing",
		},
		{
			name: "alias cycle",
			in:   "rules: &r [*r]",
			want: "rules.yaml:1: an alias refers to a node that contains it",
		},
		{
			name: "billion laughs",
			in: `a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
rules: [*f]`,
			want: "rules.yaml:1: more than 131072 values once aliases are expanded",
		},
		{
			name: "json duplicate key",
			in:   `{"rules": [{"name": "a", "name": "b", "key": "ip", "limits": [{"requests": 1, "window": "1m"}]}]}`,
			want: "rules.yaml:1: rules[0].name: defined twice (first at line 1)",
		},
		{
			name: "json requests string",
			in:   `{"rules": [{"name": "a", "key": "ip", "limits": [{"requests": "1", "window": "1m"}]}]}`,
			want: `rules.yaml:1: rules[0].limits[0].requests: want an integer, got "1"`,
		},
		{
			name: "many errors",
			in: `rules:
  - {name: a, key: x1, limits: [{requests: 0, window: 0s}]}
  - {name: b, key: x2, limits: [{requests: 0, window: 0s}]}
  - {name: c, key: x3, limits: [{requests: 0, window: 0s}]}
  - {name: d, key: x4, limits: [{requests: 0, window: 0s}]}`,
			want: `rules.yaml:2: rules[0].key: unknown key name "x1" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)
rules.yaml:2: rules[0].limits[0].requests: 0 must be at least 1
rules.yaml:2: rules[0].limits[0].window: duration "0s" must be positive
rules.yaml:3: rules[1].key: unknown key name "x2" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)
rules.yaml:3: rules[1].limits[0].requests: 0 must be at least 1
rules.yaml:3: rules[1].limits[0].window: duration "0s" must be positive
rules.yaml:4: rules[2].key: unknown key name "x3" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)
rules.yaml:4: rules[2].limits[0].requests: 0 must be at least 1
rules.yaml:4: rules[2].limits[0].window: duration "0s" must be positive
rules.yaml:5: rules[3].key: unknown key name "x4" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)
rules.yaml: 2 more errors`,
		},
		{
			name: "syn2",
			in: `rules:
  - name: a
    key: ip
  limits: [`,
			want: "rules.yaml:4: did not find expected '-' indicator",
		},
		{
			name: "syn3",
			in: `rules:
  - {name: a, key: ip
  - b`,
			want: "rules.yaml:2: did not find expected ',' or '}'",
		},
		{
			name: "syn4",
			in: `a: 1
b: 2
c: 3
d: [1, 2
e: 4`,
			want: "rules.yaml:4: did not find expected ',' or ']'",
		},
		{
			name: "syn5",
			in: `rules:
- name: a
  key: ip
 limits: 3`,
			want: "rules.yaml:4: did not find expected key",
		},
		{
			name: "syn6",
			in:   "rules: *nope",
			want: "rules.yaml:1: unknown anchor 'nope' referenced",
		},
		{
			name: "syn7",
			in: `rules:
  - name: a
    key: ip
      limits: x
`,
			want: "rules.yaml:4: mapping values are not allowed in this context",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := testEnv()
			if tt.bareEnv {
				env = config.Env{}
			}
			cfg, err := config.Parse([]byte(tt.in), "rules.yaml", env)
			if err == nil {
				t.Fatalf("Parse accepted the file: %+v", cfg.Rules)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n%s\nwant\n%s", err, tt.want)
			}
			var e *config.Error
			if !errors.As(err, &e) || e.File != "rules.yaml" {
				t.Errorf("errors.As(%T, *config.Error) = %v, %+v", err, e != nil, e)
			}
		})
	}
}

func TestErrorFields(t *testing.T) {
	t.Parallel()
	_, err := config.Parse([]byte("rules:\n  - name: api\n    key: ip\n    limits: [{requests: 1, window: 5x}]\n"), "dir/rules.yaml", config.Env{})
	var e *config.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *config.Error", err)
	}
	want := config.Error{File: "dir/rules.yaml", Line: 4, Field: "rules[0].limits[0].window", Msg: `bad duration "5x"`}
	if *e != want {
		t.Errorf("got %+v, want %+v", *e, want)
	}
	for _, tt := range []struct {
		e    config.Error
		want string
	}{
		{config.Error{File: "f", Line: 2, Field: "a.b", Msg: "bad"}, "f:2: a.b: bad"},
		{config.Error{File: "f", Line: 2, Msg: "bad"}, "f:2: bad"},
		{config.Error{File: "f", Msg: "bad"}, "f: bad"},
	} {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v: %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestEnvErrors(t *testing.T) {
	t.Parallel()
	const src = "rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]"
	ip := keyfunc.RemoteIP()
	tests := []struct {
		name string
		env  config.Env
		want string
	}{
		{"bad key name", config.Env{Keys: map[string]keyfunc.Func{"Tenant": ip}},
			`config: Env.Keys: bad name "Tenant": want lower case letters, digits and '_', starting with a letter`},
		{"key name with +", config.Env{Keys: map[string]keyfunc.Func{"a+b": ip}},
			`config: Env.Keys: bad name "a+b": want lower case letters, digits and '_', starting with a letter`},
		{"nil key", config.Env{Keys: map[string]keyfunc.Func{"tenant": nil}},
			`config: Env.Keys: "tenant" is nil`},
		{"bad API key header", config.Env{APIKeyHeader: "X API"},
			`config: Env.APIKeyHeader: bad header name "X API"`},
		{"proxy header without proxies", config.Env{ProxyHeader: "X-Real-IP"},
			"config: Env.ProxyHeader is set but Env.TrustedProxies is empty: no proxy would be trusted"},
		{"bad proxy header", config.Env{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, ProxyHeader: "X-Client"},
			`config: ip: Env.TrustedProxies or Env.ProxyHeader: keyfunc: ClientIP: unsupported header "X-Client": use "X-Forwarded-For", "Forwarded" or "X-Real-IP"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := config.Parse([]byte(src), "rules.yaml", tt.env)
			if err == nil || err.Error() != tt.want {
				t.Errorf("Parse: %v, want %s", err, tt.want)
			}
		})
	}
}

// TestKeyNames checks the key function each key expression stands for.
func TestKeyNames(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret")
	apiKey := func(header, value string) string {
		k, err := keyfunc.APIKey(header, secret)(keyfunc.FromHTTP(request("GET", "/", "192.0.2.1:1", header, value)))
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	tenant, _ := keyfunc.Header("X-Tenant")(keyfunc.FromHTTP(request("GET", "/", "192.0.2.1:1", "X-Tenant", "acme")))
	base := config.Env{User: userFrom, APIKeySecret: secret}
	proxied := base
	proxied.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	forwarded := proxied
	forwarded.ProxyHeader = "X-Real-IP"
	bearer := base
	bearer.APIKeyHeader = "Authorization"
	custom := base
	custom.Keys = map[string]keyfunc.Func{
		"tenant": func(r keyfunc.Request) (string, error) { return "t:" + r.Header("X-Tenant"), nil },
		"ip":     keyfunc.RemoteIPWithPrefix(24, 48),
	}

	anon := request("GET", "/api/x", "192.0.2.1:1")
	alice := withUser(request("GET", "/api/x", "192.0.2.1:1"), "alice")
	tests := []struct {
		expr string
		env  config.Env
		req  *http.Request
		want string // "" for a request without a key
	}{
		{"ip", base, anon, "ip:192.0.2.1"},
		{"ip", base, request("GET", "/", "[2001:db8:1:2:3::4]:1"), "ip:2001:db8:1:2::/64"},
		{"ip", base, request("GET", "/", "192.0.2.1:1", "X-Forwarded-For", "198.51.100.1"), "ip:192.0.2.1"},
		{"ip", proxied, request("GET", "/", "10.1.1.1:1", "X-Forwarded-For", "198.51.100.1"), "ip:198.51.100.1"},
		{"ip", proxied, request("GET", "/", "192.0.2.1:1", "X-Forwarded-For", "198.51.100.1"), "ip:192.0.2.1"},
		{"ip", forwarded, request("GET", "/", "10.1.1.1:1", "X-Real-IP", "198.51.100.2"), "ip:198.51.100.2"},
		{"user_id", base, alice, "user:alice"},
		{"user_id", base, anon, ""},
		{"user_or_ip", base, alice, "user:alice"},
		{"user_or_ip", base, anon, "ip:192.0.2.1"},
		{"user_id|ip", base, anon, "ip:192.0.2.1"},
		{"api_key", base, request("GET", "/", "192.0.2.1:1", "X-API-Key", "k1"), apiKey("X-API-Key", "k1")},
		{"api_key", base, anon, ""},
		{"api_key", bearer, request("GET", "/", "192.0.2.1:1", "Authorization", "Bearer k1"), apiKey("X-API-Key", "k1")},
		{"api_key|ip", base, anon, "ip:192.0.2.1"},
		{"header:X-Tenant", base, request("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), tenant},
		{"header:x-tenant", base, request("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), tenant},
		{"header:X-Tenant", base, anon, ""},
		{"route", base, anon, "path:/api/x"},
		{"method", base, request("DELETE", "/", "192.0.2.1:1"), "m:DELETE"},
		{"global", base, anon, "global"},
		{"ip+route", base, anon, "ip:192.0.2.1|path:/api/x"},
		{" ip + method ", base, anon, "ip:192.0.2.1|m:GET"},
		{"user_id|ip+method", base, alice, "user:alice|m:GET"},
		{"user_id|ip+method", base, anon, "ip:192.0.2.1|m:GET"},
		{"tenant", custom, request("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), "t:acme"},
		{"ip", custom, anon, "ip:192.0.2.0/24"}, // Env.Keys replaces a built-in
		{"tenant+ip", custom, request("GET", "/", "192.0.2.1:1", "X-Tenant", "acme"), "t:acme|ip:192.0.2.0/24"},
	}
	for _, tt := range tests {
		cfg, err := config.Parse([]byte("rules: [{name: r, key: \""+tt.expr+"\", limits: [{requests: 1, window: 1m}]}]"), "rules.yaml", tt.env)
		if err != nil {
			t.Errorf("key %q: %v", tt.expr, err)
			continue
		}
		got, err := cfg.Rules[0].Key(keyfunc.FromHTTP(tt.req))
		if tt.want == "" {
			if !errors.Is(err, keyfunc.ErrNoKey) {
				t.Errorf("key %q: got %q, %v; want ErrNoKey", tt.expr, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("key %q: got %q, %v; want %q", tt.expr, got, err, tt.want)
		}
	}
}

// TestParse checks that every field of the schema reaches the rules.
func TestParse(t *testing.T) {
	t.Parallel()
	const src = `
headers: draft
allow:
  cidrs: [203.0.113.0/24, "2001:db8::/32", 198.51.100.7]
  keys: ["user:ops"]
rules:
  - name: api
    match: {path: "/api/*", methods: [get, Post]}
    key: user_or_ip
    limits:
      - {requests: 100, window: 1m}
      - {requests: 1000, window: 1h}
    cost: 2
    overage: 0.25
    shadow: true
    allow: {cidrs: [192.0.2.0/24], keys: ["user:bot"]}
    plans:
      pro: [{requests: 500, window: 1m}]
      team: [{requests: 300, window: 30s}, {requests: 5000, window: 1d}]
  - name: everything
    key: global
    limits: [{requests: 10000, window: 500ms}]
`
	cfg := mustParse(t, src, testEnv())
	if cfg.File != "rules.yaml" || cfg.HeaderStyle != headers.Draft || cfg.Shadow {
		t.Errorf("file %q, headers %v, shadow %v", cfg.File, cfg.HeaderStyle, cfg.Shadow)
	}
	if len(cfg.Rules) != 2 {
		t.Fatalf("%d rules, want 2", len(cfg.Rules))
	}
	api, all := cfg.Rules[0], cfg.Rules[1]
	type summary struct {
		Name, Path string
		Methods    []string
		Limits     []middleware.Limit
		Cost       int
		Overage    float64
		Shadow     bool
		AllowCIDRs []netip.Prefix
		AllowKeys  []string
		Plans      bool
	}
	sum := func(r middleware.Rule) summary {
		return summary{r.Name, r.Path, r.Methods, r.Limits, r.Cost, r.Overage, r.Shadow, r.AllowCIDRs, r.AllowKeys, r.LimitsFunc != nil}
	}
	global := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("198.51.100.7/32")}
	wantAPI := summary{
		Name: "api", Path: "/api/*", Methods: []string{"GET", "POST"},
		Limits: []middleware.Limit{middleware.PerMinute(100), middleware.PerHour(1000)},
		Cost:   2, Overage: 0.25, Shadow: true,
		AllowCIDRs: append(slices.Clone(global), netip.MustParsePrefix("192.0.2.0/24")),
		AllowKeys:  []string{"user:ops", "user:bot"},
		Plans:      true,
	}
	wantAll := summary{
		Name: "everything", Limits: []middleware.Limit{{Requests: 10000, Window: 500 * time.Millisecond}},
		AllowCIDRs: global, AllowKeys: []string{"user:ops"},
	}
	for _, c := range []struct{ got, want summary }{{sum(api), wantAPI}, {sum(all), wantAll}} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("rule %s:\n got %+v\nwant %+v", c.want.Name, c.got, c.want)
		}
	}
	for _, p := range []struct {
		plan string
		want []middleware.Limit
	}{
		{"", []middleware.Limit{middleware.PerMinute(100), middleware.PerHour(1000)}},
		{"free", []middleware.Limit{middleware.PerMinute(100), middleware.PerHour(1000)}},
		{"pro", []middleware.Limit{middleware.PerMinute(500)}},
		{"team", []middleware.Limit{{Requests: 300, Window: 30 * time.Second}, {Requests: 5000, Window: 24 * time.Hour}}},
	} {
		got := api.LimitsFunc(keyfunc.FromHTTP(request("GET", "/", "192.0.2.1:1", "X-Plan", p.plan)), "ip:192.0.2.1")
		if !slices.Equal(got, p.want) {
			t.Errorf("plan %q: limits %v, want %v", p.plan, got, p.want)
		}
	}
}

// TestRulesInLimiter runs requests through a Limiter built from a file:
// plans, allowlists, shadow rules and the header style.
func TestAlgorithms(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	const file = `
rules:
  - name: defaults
    key: ip
    limits: [{requests: 100, window: 1m}]
  - name: bucket
    key: ip
    algorithm: token_bucket
    limits:
      - {requests: 4, window: 1s, burst: 8}
      - {requests: 1000, window: 1h}
      - {requests: 5, window: 1m, algorithm: sliding_log}
  - name: quota
    key: ip
    time_zone: Europe/Paris
    limits:
      - {requests: 1000, window: calendar_day}
      - {requests: 20000, window: calendar_month, time_zone: UTC}
      - {requests: 3, window: 1d, algorithm: fixed_window}
  - name: login
    key: ip
    limits: [{requests: 2000, window: 15m, algorithm: sliding_log, max_log: 2000}]
  - name: planned
    key: ip
    algorithm: fixed_window
    limits: [{requests: 10, window: 1m}]
    plans:
      pro: [{requests: 100, window: 1m}, {requests: 3, window: calendar_week}]
`
	env := config.Env{Plan: func(keyfunc.Request, string) string { return "pro" }}
	cfg, err := config.Parse([]byte(file), "rules.yaml", env)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]middleware.Limit{
		"defaults": {middleware.PerMinute(100)},
		"bucket": {
			middleware.PerSecond(4).TokenBucket(8),
			middleware.PerHour(1000).TokenBucket(0),
			middleware.PerMinute(5).SlidingLog(),
		},
		"quota": {
			middleware.Calendar(1000, middleware.CalendarDay, paris),
			middleware.Calendar(20000, middleware.CalendarMonth, time.UTC),
			middleware.PerDay(3).FixedWindow(),
		},
		"login":   {{Requests: 2000, Window: 15 * time.Minute, Algorithm: middleware.SlidingLog, MaxLog: 2000}},
		"planned": {middleware.PerMinute(10).FixedWindow()},
	}
	for _, r := range cfg.Rules {
		if !reflect.DeepEqual(r.Limits, want[r.Name]) {
			t.Errorf("rule %s: limits %v, want %v", r.Name, r.Limits, want[r.Name])
		}
		if r.Name == "planned" {
			got := r.LimitsFunc(keyfunc.FromHTTP(httptest.NewRequest("GET", "/", nil)), "ip:192.0.2.1")
			wantPro := []middleware.Limit{middleware.PerMinute(100).FixedWindow(), middleware.Calendar(3, middleware.CalendarWeek, nil)}
			if !reflect.DeepEqual(got, wantPro) {
				t.Errorf("plan pro: limits %v, want %v", got, wantPro)
			}
		}
	}
	if _, err := middleware.NewRules(cfg.Rules); err != nil {
		t.Errorf("NewRules: %v", err)
	}
}

func TestRulesInLimiter(t *testing.T) {
	t.Parallel()
	const src = `
headers: legacy
allow: {cidrs: [203.0.113.0/24]}
rules:
  - name: api
    match: {path: /api/*}
    key: user_or_ip
    limits: [{requests: 2, window: 1m}]
    allow: {keys: ["user:ops"]}
    plans:
      pro: [{requests: 4, window: 1m}]
  - name: login
    match: {path: /api/login, methods: [POST]}
    key: ip
    limits: [{requests: 1, window: 5m}]
  - name: search
    match: {path: /api/search}
    key: ip
    shadow: true
    limits: [{requests: 1, window: 1m}]
`
	cfg := mustParse(t, src, testEnv())
	var shadowed atomic.Int64
	lim, _ := limiter(t, cfg, middleware.WithObserver(&middleware.Hooks{OnDecided: func(_ keyfunc.Request, res *middleware.Result) {
		if res.Shadowed {
			shadowed.Add(1)
		}
	}}))
	h := lim.Handler(okHandler)
	admitted := func(n int, mk func() *http.Request) int {
		ok := 0
		for range n {
			if serve(h, mk()).Code == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	tests := []struct {
		name string
		req  func() *http.Request
		n    int
		want int
	}{
		{"free user", func() *http.Request { return withUser(request("GET", "/api/x", "192.0.2.1:1"), "ann") }, 5, 2},
		{"pro user", func() *http.Request {
			return withUser(request("GET", "/api/x", "192.0.2.1:1", "X-Plan", "pro"), "bob")
		}, 6, 4},
		{"unknown plan gets the default", func() *http.Request {
			return withUser(request("GET", "/api/x", "192.0.2.1:1", "X-Plan", "gold"), "cy")
		}, 5, 2},
		{"allowlisted key", func() *http.Request { return withUser(request("GET", "/api/x", "192.0.2.1:1"), "ops") }, 5, 5},
		{"allowlisted network", func() *http.Request { return request("POST", "/api/login", "203.0.113.9:1") }, 5, 5},
		{"login per address", func() *http.Request { return request("POST", "/api/login", "192.0.2.2:1") }, 3, 1},
		{"shadow rule never denies", func() *http.Request { return withUser(request("GET", "/api/search", "192.0.2.3:1"), "dee") }, 2, 2},
	}
	for _, tt := range tests {
		if got := admitted(tt.n, tt.req); got != tt.want {
			t.Errorf("%s: %d of %d admitted, want %d", tt.name, got, tt.n, tt.want)
		}
	}
	if shadowed.Load() == 0 {
		t.Error("the shadow rule's denial was not reported")
	}
	// headers: legacy
	rec := serve(h, request("GET", "/api/y", "192.0.2.9:1"))
	if rec.Header().Get(headers.Limit) != "2" || rec.Header().Get(headers.RateLimitPolicy) != "" {
		t.Errorf("legacy headers: %v", rec.Header())
	}
}

func TestGlobalShadow(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, `
shadow: true
rules:
  - {name: a, key: ip, limits: [{requests: 1, window: 1m}]}
  - {name: b, key: ip, shadow: false, limits: [{requests: 1, window: 1m}]}
`, config.Env{})
	if !cfg.Shadow || !cfg.Rules[0].Shadow || !cfg.Rules[1].Shadow {
		t.Fatalf("shadow %v, rules %v %v: the top-level setting must win", cfg.Shadow, cfg.Rules[0].Shadow, cfg.Rules[1].Shadow)
	}
	lim, _ := limiter(t, cfg)
	h := lim.Handler(okHandler)
	for i := range 3 {
		if rec := serve(h, request("GET", "/", "192.0.2.1:1")); rec.Code != 200 {
			t.Fatalf("request %d: status %d", i, rec.Code)
		}
	}
}

// TestExampleFile loads the file the example server ships with.
func TestExampleFile(t *testing.T) {
	t.Parallel()
	const path = "../../example/rules.yaml"
	env := testEnv()
	// The example's program supplies the key name account (the account a
	// login is for).
	env.Keys = map[string]keyfunc.Func{"account": keyfunc.Header("X-Account")}
	cfg, err := config.Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range cfg.Rules {
		names = append(names, r.Name)
	}
	if want := []string{"api", "login", "login-failures", "chat", "quotes", "exports", "reports", "slow", "smooth", "uploads", "burst", "work", "work-batch", "work-checkout", "search-trial", "feed", "events"}; !slices.Equal(names, want) {
		t.Errorf("rules %v, want %v", names, want)
	}
	lim, _ := limiter(t, cfg)
	h := lim.Handler(okHandler)
	count := func(n int, r func() *http.Request) (ok int) {
		for range n {
			if serve(h, r()).Code == 200 {
				ok++
			}
		}
		return ok
	}
	if got := count(7, func() *http.Request { return request("POST", "/api/login", "192.0.2.1:1") }); got != 5 {
		t.Errorf("logins: %d of 7 admitted, want 5", got)
	}
	if got := count(4, func() *http.Request { return request("POST", "/api/upload", "192.0.2.2:1") }); got != 2 {
		t.Errorf("uploads: %d of 4 admitted, want 2 a minute", got)
	}
	if got := count(12, func() *http.Request { return request("GET", "/api/search", "192.0.2.3:1") }); got != 12 {
		t.Errorf("searches: %d of 12 admitted; the trial rule must not deny", got)
	}
	if got := count(10, func() *http.Request { return request("POST", "/api/login", "203.0.113.1:1") }); got != 10 {
		t.Errorf("allowlisted logins: %d of 10 admitted", got)
	}
	// The api rule admits 110 of its nominal 100 a minute.
	if got := count(120, func() *http.Request { return request("GET", "/api/items", "192.0.2.4:1") }); got != 110 {
		t.Errorf("api: %d of 120 admitted, want 110", got)
	}

	// The file's plans need Env.Plan.
	env.Plan = nil
	_, err = config.Load(path, env)
	if err == nil || !strings.HasPrefix(err.Error(), path+":") || !strings.Contains(err.Error(), "rules[0].plans: the program supplies no Env.Plan") {
		t.Errorf("without Env.Plan: %v", err)
	}
}

// TestJSON checks that JSON, a subset of YAML, loads to the same rules.
func TestJSON(t *testing.T) {
	t.Parallel()
	const yamlSrc = `
allow: {cidrs: [203.0.113.0/24]}
rules:
  - name: login
    match: {path: /api/login, methods: [POST]}
    key: ip+route
    cost: 2
    limits: [{requests: 10, window: 5m}, {requests: 4, window: 1s}]
`
	const jsonSrc = `{
  "allow": {"cidrs": ["203.0.113.0/24"]},
  "rules": [
    {
      "name": "login",
      "match": {"path": "/api/login", "methods": ["POST"]},
      "key": "ip+route",
      "cost": 2,
      "limits": [{"requests": 10, "window": "5m"}, {"requests": 4, "window": "1s"}]
    }
  ]
}`
	y := mustParse(t, yamlSrc, config.Env{})
	j, err := config.Parse([]byte(jsonSrc), "rules.json", config.Env{})
	if err != nil {
		t.Fatal(err)
	}
	if len(j.Rules) != 1 {
		t.Fatalf("%d rules", len(j.Rules))
	}
	a, b := y.Rules[0], j.Rules[0]
	if a.Name != b.Name || a.Path != b.Path || !slices.Equal(a.Methods, b.Methods) || !slices.Equal(a.Limits, b.Limits) ||
		a.Cost != b.Cost || !slices.Equal(a.AllowCIDRs, b.AllowCIDRs) {
		t.Errorf("YAML %+v\nJSON %+v", a, b)
	}
	_, err = config.Parse([]byte("{\"rules\": [\n  {\"name\": \"a\", \"key\": \"ip\"\n  \"limits\": []}\n]}"), "rules.json", config.Env{})
	// The line is that of the mapping that lacks the comma.
	if want := `rules.json:2: did not find expected ',' or '}'`; err == nil || err.Error() != want {
		t.Errorf("JSON without a comma: %v, want %s", err, want)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := config.Load(missing, config.Env{}); err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", config.MaxFileSize)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := config.Load(big, config.Env{}); err == nil || err.Error() != big+": file larger than 1048576 bytes" {
		t.Errorf("large file: %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("rules:\n  - name: a\n    key: nobody\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(bad, config.Env{})
	if want := bad + `:3: rules[0].key: unknown key name "nobody" (want ip, user_id, api_key, header:<Name>, route, method, global, user_or_ip)`; err == nil || err.Error() != want {
		t.Errorf("bad file: %v\nwant %s", err, want)
	}
}

// TestWindowUnits parses every unit a window may use, and the limits of
// any size a plan may need.
func TestWindowUnits(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	tests := []struct {
		requests, window string
		want             middleware.Limit
	}{
		{"100", "500ms", middleware.Limit{Requests: 100, Window: 500 * time.Millisecond}},
		{"100", "1m", middleware.PerMinute(100)},
		{"100", "1h30m", middleware.Limit{Requests: 100, Window: 90 * time.Minute}},
		{"1000", "1d", middleware.Limit{Requests: 1000, Window: day}},
		{"5000", "1w", middleware.Limit{Requests: 5000, Window: 7 * day}},
		{"5000", "2w", middleware.Limit{Requests: 5000, Window: 14 * day}},
		{"1000000", "30d", middleware.Limit{Requests: 1_000_000, Window: 30 * day}},
		{"1000000000", "1h", middleware.PerHour(1_000_000_000)},
		{"1000000000000", "366d", middleware.Limit{Requests: 1e12, Window: 366 * day}},
		{"1", "3660d", middleware.Limit{Requests: 1, Window: 3660 * day}},
	}
	for _, tt := range tests {
		src := "rules: [{name: a, key: ip, limits: [{requests: " + tt.requests + ", window: " + tt.window + "}]}]"
		cfg, err := config.Parse([]byte(src), "rules.yaml", config.Env{})
		if err != nil {
			t.Errorf("%s per %s: %v", tt.requests, tt.window, err)
			continue
		}
		if got := cfg.Rules[0].Limits; len(got) != 1 || got[0] != tt.want {
			t.Errorf("%s per %s: limits %v, want %v", tt.requests, tt.window, got, tt.want)
		}
	}
}

// TestTopClientsField: top_clients sets Rule.TopClients; -1 keeps only
// the rule's rates.
func TestTopClientsField(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"": 0, "top_clients: 20,": 20, "top_clients: -1,": -1} {
		doc, err := config.Parse([]byte("rules: [{name: a, key: ip, "+in+" limits: [{requests: 1, window: 1s}]}]"), "rules.yaml", config.Env{})
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := doc.Rules[0].TopClients; got != want {
			t.Errorf("%q: TopClients %d, want %d", in, got, want)
		}
	}
}
