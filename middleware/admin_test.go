package middleware_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// adminLimits are one limit of each algorithm, each admitting 3 at once.
var adminLimits = map[string]middleware.Limit{
	"sw": middleware.PerMinute(3),
	"fw": middleware.PerMinute(3).FixedWindow(),
	"sl": middleware.PerMinute(3).SlidingLog(),
	"tb": middleware.PerMinute(3).TokenBucket(0),
	"lb": middleware.PerMinute(3).LeakyBucket(2, 0), // one served + 2 waiting
	"cd": middleware.Calendar(3, middleware.CalendarDay, nil),
}

// TestPeekAndReset: on the memory store and on Redis, for every
// algorithm, Peek reads without charging and Reset gives the client its
// whole limit back.
func TestPeekAndReset(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) middleware.Store{
		"memory": func(*testing.T) middleware.Store { return nil },
		"redis": func(t *testing.T) middleware.Store {
			// What is tested is what Peek and Reset do, not the store's
			// bound: a Timeout of 5 s (and a stall threshold of 2 s) keep
			// a loaded machine's round trips out of it (a first Peek,
			// which opens the connections, took more than 100 ms).
			srv := redistest.Shared(t)
			s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			closeStore(t, s)
			return s
		},
	}
	for storeName, newStore := range stores {
		for name, l := range adminLimits {
			t.Run(storeName+"/"+name, func(t *testing.T) {
				t.Parallel()
				opts := []middleware.Option{middleware.WithClock(newClock(t0).Now)}
				if s := newStore(t); s != nil {
					opts = append(opts, middleware.WithStore(s))
				}
				lim, err := middleware.NewRules([]middleware.Rule{{Name: "r", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{l}}}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				defer lim.Close()
				ctx := context.Background()
				peek := func() int {
					t.Helper()
					st, err := lim.Peek(ctx, "r", "ip:192.0.2.1")
					if err != nil || len(st) != 1 {
						t.Fatalf("Peek: %v %v", st, err)
					}
					return st[0].Remaining
				}
				if got := peek(); got != 3 {
					t.Fatalf("fresh: remaining %d, want 3", got)
				}
				for range 2 {
					if res, err := lim.Decide(keyfunc.FromHTTP(get("192.0.2.1:1"))); err != nil || !res.Allowed {
						t.Fatalf("Decide: %+v %v", res, err)
					}
				}
				if a, b := peek(), peek(); a != 1 || b != 1 {
					t.Fatalf("after 2 requests: Peek says %d then %d, want 1 and 1 (peeking charges nothing)", a, b)
				}
				if err := lim.Reset(ctx, "r", "ip:192.0.2.1"); err != nil {
					t.Fatal(err)
				}
				if got := peek(); got != 3 {
					t.Fatalf("after Reset: remaining %d, want 3", got)
				}
				if _, err := lim.Peek(ctx, "nope", "k"); err == nil {
					t.Error("Peek of an unknown rule succeeded")
				}
			})
		}
	}
}

// TestAdminHandler: refused without an authorization function or when it
// says no; rules, limits and reset when it says yes.
func TestAdminHandler(t *testing.T) {
	t.Parallel()
	lim := newLimiter(t, middleware.PerMinute(2), keyfunc.RemoteIP())
	do(lim.Handler(ok), get("192.0.2.1:1"))
	call := func(h http.Handler, method, target string, token string) (int, map[string]any) {
		r := httptest.NewRequest(method, target, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		return rec.Code, body
	}
	if code, _ := call(middleware.AdminHandler(lim, middleware.AdminConfig{}), "GET", "/rules", "secret"); code != 403 {
		t.Errorf("no Authorize: %d, want 403", code)
	}
	h := middleware.AdminHandler(lim, middleware.AdminConfig{
		Authorize: func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer secret" },
		Source:    func() (string, string) { return "rules.yaml", "abc123" },
	})
	if code, _ := call(h, "GET", "/rules", "wrong"); code != 403 {
		t.Errorf("wrong token: %d, want 403", code)
	}
	code, body := call(h, "GET", "/rules", "secret")
	if code != 200 || body["source"] != "rules.yaml" || body["version"] != "abc123" || !strings.Contains(toJSON(body["rules"]), `"name":"default"`) {
		t.Errorf("/rules: %d %v", code, body)
	}
	code, body = call(h, "GET", "/limits?rule=default&key=ip:192.0.2.1", "secret")
	if code != 200 || !strings.Contains(toJSON(body["limits"]), `"remaining":1`) {
		t.Errorf("/limits: %d %v", code, body)
	}
	if code, _ := call(h, "GET", "/reset?key=ip:192.0.2.1", "secret"); code != 405 {
		t.Errorf("GET /reset: %d, want 405", code)
	}
	if code, _ := call(h, "POST", "/reset?key=ip:192.0.2.1", "secret"); code != 200 {
		t.Errorf("POST /reset: %d", code)
	}
	code, body = call(h, "GET", "/limits?rule=default&key=ip:192.0.2.1", "secret")
	if code != 200 || !strings.Contains(toJSON(body["limits"]), `"remaining":2`) {
		t.Errorf("/limits after reset: %d %v", code, body)
	}
	if code, _ := call(h, "GET", "/limits?rule=nope&key=k", "secret"); code != 404 {
		t.Errorf("unknown rule: %d, want 404", code)
	}
	if code, _ := call(h, "GET", "/limits?rule=default", "secret"); code != 400 {
		t.Errorf("no key: %d, want 400", code)
	}
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
