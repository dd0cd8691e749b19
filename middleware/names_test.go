package middleware_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestPolicyWindowNames: a rule with several limits names each policy
// after its window as a rules file spells it (the same name config's
// errors use), and two limits with one window are refused under that
// name.
func TestPolicyWindowNames(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		window time.Duration
		want   string
	}{
		{time.Second, "api-1s"},
		{90 * time.Second, "api-1m30s"},
		{time.Hour, "api-1h"},
		{36 * time.Hour, "api-36h"},
		{24 * time.Hour, "api-1d"},
		{48 * time.Hour, "api-2d"},
		{7 * 24 * time.Hour, "api-1w"},
	} {
		lim, err := middleware.NewRules([]middleware.Rule{{
			Name: "api", Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{{Requests: 1000, Window: tt.window}, middleware.PerMinute(30)},
		}})
		if err != nil {
			t.Fatal(err)
		}
		rec := do(lim.Handler(ok), get("192.0.2.1:1"))
		lim.Close()
		if got := rec.Header().Get(headers.RateLimitPolicy); !strings.HasPrefix(got, `"`+tt.want+`";`) {
			t.Errorf("window %v: RateLimit-Policy %s, want the first named %s", tt.window, got, tt.want)
		}
	}
	_, err := middleware.NewRules([]middleware.Rule{{
		Name: "api", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{middleware.PerDay(10), {Requests: 5, Window: 24 * time.Hour, Algorithm: middleware.FixedWindow}},
	}})
	if want := `sluice: rule "api": two limits with window 1d; one limit per window`; err == nil || err.Error() != want {
		t.Errorf("two limits of one day: %v, want %s", err, want)
	}
}
