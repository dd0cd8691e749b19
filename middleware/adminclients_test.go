package middleware_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/middleware"
)

// TestAdminClients lists and lifts a ban, and sets, reads and removes an
// override through the admin handler; bad input gets 400 (or 404) and
// changes nothing.
func TestAdminClients(t *testing.T) {
	t.Parallel()
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	lim, err := middleware.NewRules(append(banRules(), apiRules(0)[0]), middleware.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	admin := middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: func(*http.Request) bool { return true }})
	call := func(method, target, body string) (int, map[string]any) {
		t.Helper()
		rr := httptest.NewRecorder()
		admin.ServeHTTP(rr, httptest.NewRequest(method, target, strings.NewReader(body)))
		var out map[string]any
		if err := json.Unmarshal(rr.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, target, rr.Code, rr.Body, err)
		}
		return rr.Code, out
	}
	for range 3 {
		doFrom(h, "192.0.2.1:1", "/login")
	}
	clk.Add(10 * time.Minute)
	code, out := call("GET", "/bans", "")
	bans, _ := out["bans"].([]any)
	if code != 200 || out["total"] != 1.0 || len(bans) != 1 {
		t.Fatalf("GET /bans: %d %v", code, out)
	}
	if b := bans[0].(map[string]any); b["rule"] != "login" || b["key"] != "ip:192.0.2.1" || b["seconds_left"] != 3000.0 || b["until"] != "2030-01-01T01:00:00Z" {
		t.Fatalf("ban %v", b)
	}
	if code, _ := call("DELETE", "/bans?rule=login", ""); code != 400 {
		t.Fatalf("DELETE /bans without key: %d", code)
	}
	if code, _ := call("DELETE", "/bans?rule=nope&key=ip:192.0.2.1", ""); code != 404 {
		t.Fatalf("DELETE /bans of an unknown rule: %d", code)
	}
	if code, out := call("DELETE", "/bans?rule=login&key=ip:192.0.2.1", ""); code != 200 || out["lifted"] != true {
		t.Fatalf("DELETE /bans: %d %v", code, out)
	}
	if doFrom(h, "192.0.2.1:1", "/login").Code != 200 {
		t.Fatal("still banned after the lift")
	}

	for _, bad := range []struct {
		target, body string
		code         int
		want         string
	}{
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 0, "window": "1m"}]}`, 400, "requests"},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 5, "window": "soon"}]}`, 400, `limits[0].window "soon"`},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 5}]}`, 400, "limits[0].window is required"},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 5, "window": "1m", "algorithm": "magic"}]}`, 400, "algorithm"},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 5, "window": "1m"}], "extra": 1}`, 400, "unknown field"},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": []}`, 400, "no limits"},
		{"/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 5, "window": "1m"}], "ttl": "-1h"}`, 400, "ttl"},
		{"/overrides?rule=nope&key=ip:192.0.2.2", `{"limits": [{"requests": 5, "window": "1m"}]}`, 404, "unknown rule"},
		{"/overrides?rule=api", `{"limits": [{"requests": 5, "window": "1m"}]}`, 400, "rule and key are required"},
	} {
		code, out := call("PUT", bad.target, bad.body)
		if msg, _ := out["error"].(string); code != bad.code || !strings.Contains(msg, bad.want) {
			t.Errorf("PUT %s %s: %d %v, want %d with %q", bad.target, bad.body, code, out, bad.code, bad.want)
		}
	}
	if n := len(lim.Overrides()); n != 0 {
		t.Fatalf("bad input left %d overrides", n)
	}
	code, out = call("PUT", "/overrides?rule=api&key=ip:192.0.2.2", `{"limits": [{"requests": 50, "window": "1m", "algorithm": "token_bucket", "burst": 10}], "ttl": "1h"}`)
	if code != 200 || out["until"] != "2030-01-01T01:10:00Z" {
		t.Fatalf("PUT /overrides: %d %v", code, out)
	}
	if q := doFrom(h, "192.0.2.2:1", "/x").Header().Get("X-RateLimit-Limit"); q != "10" {
		t.Fatalf("overridden quota %s, want the burst of 10", q)
	}
	code, out = call("GET", "/overrides?rule=api&key=ip:192.0.2.2", "")
	if lims, _ := out["limits"].([]any); code != 200 || len(lims) != 1 || lims[0].(map[string]any)["algorithm"] != "token_bucket" {
		t.Fatalf("GET /overrides one: %d %v", code, out)
	}
	if code, out := call("GET", "/overrides", ""); code != 200 || len(out["overrides"].([]any)) != 1 {
		t.Fatalf("GET /overrides: %d %v", code, out)
	}
	if code, out := call("DELETE", "/overrides?rule=api&key=ip:192.0.2.2", ""); code != 200 || out["removed"] != true {
		t.Fatalf("DELETE /overrides: %d %v", code, out)
	}
	if code, _ := call("GET", "/overrides?rule=api&key=ip:192.0.2.2", ""); code != 404 {
		t.Fatalf("GET a removed override: %d", code)
	}
	if code, _ := call("POST", "/overrides?rule=api&key=ip:192.0.2.2", ""); code != 405 {
		t.Fatalf("POST /overrides: %d", code)
	}
}
