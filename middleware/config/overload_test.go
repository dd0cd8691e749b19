package config_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestOverloadKeys(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`rules:
  - name: api
    key: ip
    limits: [{requests: 100, window: 1m, ceiling: 300}, {requests: 1000, window: 1h}]
  - name: protect
    adaptive_concurrency: {min: 4, max: 200, status: 429}
  - name: batch
    match: {path: /batch/*}
    priority: sheddable
  - name: checkout
    match: {path: /checkout}
    key: ip
    priority: critical
    limits: [{requests: 10, window: 1s, algorithm: sliding_log, ceiling: 20}]
`), "rules.yaml", config.Env{})
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules
	if got := r[0].Limits[0]; got.Requests != 100 || got.Window != time.Minute || got.Ceiling != 300 {
		t.Errorf("api limit %+v", got)
	}
	if r[0].Limits[1].Ceiling != 0 {
		t.Errorf("api's second limit has a ceiling %d", r[0].Limits[1].Ceiling)
	}
	if a := r[1].AdaptiveConcurrency; a == nil || *a != (middleware.AdaptiveConcurrency{Min: 4, Max: 200, Status: 429}) || r[1].Key != nil {
		t.Errorf("protect: %+v key %v", a, r[1].Key != nil)
	}
	if r[2].Priority != middleware.PrioritySheddable || r[3].Priority != middleware.PriorityCritical {
		t.Errorf("priorities %v %v", r[2].Priority, r[3].Priority)
	}
	if r[3].Limits[0].Ceiling != 20 {
		t.Errorf("checkout limit %+v", r[3].Limits[0])
	}
	// The Limiter takes them: a batch request is sheddable.
	lim, err := middleware.NewRules(cfg.Rules, cfg.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	req := httptest.NewRequest(http.MethodGet, "/batch/x", nil)
	res, err := lim.Decide(keyfunc.FromHTTP(req))
	if err != nil || !res.Allowed || res.Priority != middleware.PrioritySheddable {
		t.Fatalf("batch: %+v %v", res, err)
	}
	res.Done()
}

func TestOverloadKeyErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"rules: [{name: a, key: ip, limits: [{requests: 10, window: 1s, ceiling: 10}]}]",
			"rules.yaml:1: rules[0].limits[0].ceiling: 10 must be above requests (10)"},
		{"rules: [{name: a, key: ip, limits: [{requests: 10, window: 1s, ceiling: 0}]}]",
			"rules.yaml:1: rules[0].limits[0].ceiling: 0 must be between 1 and 2^50"},
		{"rules: [{name: a, key: ip, limits: [{requests: 10, window: 1s, algorithm: token_bucket, ceiling: 20}]}]",
			"rules.yaml:1: rules[0].limits[0].ceiling: applies only to the sliding_window, fixed_window and sliding_log algorithms, not to token_bucket"},
		{"rules: [{name: a, key: ip, overage: 0.1, limits: [{requests: 10, window: 1s, ceiling: 20}]}]",
			"rules.yaml:1: rules[0].overage: a rule whose limits have a ceiling has no overage"},
		{"rules: [{name: a, adaptive_concurrency: {min: 0, max: 4}}]",
			"rules.yaml:1: rules[0].adaptive_concurrency.min: 0 must be at least 1"},
		{"rules: [{name: a, adaptive_concurrency: {min: 8, max: 4}}]",
			"rules.yaml:1: rules[0].adaptive_concurrency.max: 4 is below min 8"},
		{"rules: [{name: a, adaptive_concurrency: {max: 4}}]",
			"rules.yaml:1: rules[0].adaptive_concurrency.min: required"},
		{"rules: [{name: a, adaptive_concurrency: {min: 1, max: 4, status: 500}}]",
			"rules.yaml:1: rules[0].adaptive_concurrency.status: 500: want 503 or 429"},
		{"rules: [{name: a, adaptive_concurrency: {min: 1, max: 4, limit: 3}}]",
			"rules.yaml:1: rules[0].adaptive_concurrency.limit: unknown field (want min, max, status)"},
		{"rules: [{name: a, adaptive_concurrency: 8}]",
			"rules.yaml:1: rules[0].adaptive_concurrency: want a mapping such as {min: 4, max: 200}, got number 8"},
		{"rules: [{name: a, priority: urgent}]",
			`rules.yaml:1: rules[0].priority: unknown priority "urgent": want sheddable, normal, high or critical`},
		{"rules: [{name: a, priority: high, limits: [{requests: 1, window: 1s}]}]",
			"rules.yaml:1: rules[0].key: required"},
	} {
		_, err := config.Parse([]byte(tc.in), "rules.yaml", config.Env{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\nerror %v\nwant  %s", tc.in, err, tc.want)
		}
	}
}
