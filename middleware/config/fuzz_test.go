package config_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// nopStore admits every request without counting.
type nopStore struct{}

func (nopStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	return true, nil
}

func (nopStore) Acquire(context.Context, time.Time, *middleware.Slot) (bool, int, error) {
	return true, 1, nil
}

func (nopStore) Release(context.Context, *middleware.Slot) error { return nil }

func (nopStore) Renew(context.Context, time.Time, []*middleware.Slot) error { return nil }

func (nopStore) TakeAt(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, time.Time, error) {
	return true, time.Now(), nil
}

func (nopStore) Refund(context.Context, time.Time, []middleware.Charge) error { return nil }

// FuzzParse checks that Parse never panics, that every error it returns
// names the file, and that the rules of every file it accepts are accepted
// by the Limiter and can decide requests.
//
//	go test -run='^$' -fuzz=FuzzParse -fuzztime=30s ./middleware/config/
func FuzzParse(f *testing.F) {
	if example, err := os.ReadFile("../../example/rules.yaml"); err == nil {
		f.Add(example)
	}
	for _, s := range []string{
		fileV1, fileV2, fileBad,
		"rules: [{name: a, key: ip, limits: [{requests: 1, window: 1m}]}]",
		`{"rules": [{"name": "a", "key": "user_or_ip", "cost": 2, "limits": [{"requests": 3, "window": "1s"}]}]}`,
		"headers: draft\nshadow: true\nallow: {cidrs: [203.0.113.0/24, \"2001:db8::/32\"], keys: [\"user:ops\"]}\n" +
			"rules:\n  - name: api\n    match: {path: /users/{id}/*, methods: [GET, post]}\n    key: api_key|ip+route\n" +
			"    limits: [{requests: 100, window: 1m}, {requests: 1000, window: 1d}]\n    overage: 0.1\n    cost: 3\n" +
			"    plans: {pro: [{requests: 500, window: 1m}]}\n    allow: {cidrs: [10.0.0.0/8]}\n",
		"base: &b {key: ip, limits: [{requests: 1, window: 1m}]}\nrules: [{<<: *b, name: a}]",
		"rules: &r [*r]",
		"rules: [{name: a, key: ip, sync: lease, lease: 20, sync_interval: 250ms, limits: [{requests: 100, window: 1m}]}, " +
			"{name: b, key: ip, sync: write_back, max_unsynced: 5, limits: [{requests: 10, window: 1s, algorithm: token_bucket}]}]",
		"rules:\n  - name: a\n   key: ip\n",
		"rules: [{name: a, key: \"header:X-Tenant+method\", match: {path: /a/*/b}, limits: [{requests: 9007199254740, window: 125ms}]}]",
		"rules: [{name: a, key: ip, priority: high, limits: [{requests: 2, window: 1s, ceiling: 5}]}, {name: b, adaptive_concurrency: {min: 1, max: 3}}]",
	} {
		f.Add([]byte(s))
	}
	env := config.Env{
		User: func(ctx context.Context) (string, bool) { return "u", true },
		Plan: func(r keyfunc.Request, _ string) string { return r.Header("X-Plan") },
	}
	reqs := []*http.Request{
		request("GET", "/", "192.0.2.1:1"),
		request("POST", "/api/login", "[2001:db8::1]:1", "X-Plan", "pro", "X-API-Key", "k"),
		request("DELETE", "/users/1/posts", "203.0.113.5:1", "X-Tenant", "t"),
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data, "fuzz.yaml", env)
		if err != nil {
			var e *config.Error
			if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			// Parse checks its rules with NewRules as a last resort; a
			// problem found only there is one its own checks missed.
			if strings.HasPrefix(e.Msg, "sluice: ") {
				t.Fatalf("only the Limiter found the problem: %v", err)
			}
			return
		}
		if len(cfg.Rules) == 0 {
			t.Fatal("accepted a file without rules")
		}
		lim, err := middleware.NewRules(cfg.Rules, append(cfg.Options(), middleware.WithStore(nopStore{}))...)
		if err != nil {
			t.Fatalf("NewRules rejected accepted rules: %v", err)
		}
		for _, r := range reqs {
			if _, err := lim.Decide(keyfunc.FromHTTP(r)); err != nil && !errors.Is(err, keyfunc.ErrNoKey) {
				t.Fatalf("Decide: %v", err)
			}
		}
	})
}
