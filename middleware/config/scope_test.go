package config_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestScopeKeys(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`rules:
  - {name: a, key: ip, scope: global, sync_interval: 50ms, limits: [{requests: 100, window: 1m}]}
  - {name: b, key: ip, scope: global, limits: [{requests: 10, window: 1s, algorithm: fixed_window}]}
  - {name: c, key: ip, scope: global_strict, limits: [{requests: 5, window: 1h, algorithm: token_bucket}]}
  - {name: d, key: ip, scope: region, limits: [{requests: 10, window: 1s}]}
  - {name: e, key: ip, limits: [{requests: 10, window: 1s}]}
`), "rules.yaml", testEnv())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		scope    middleware.Scope
		interval time.Duration
	}{
		{middleware.ScopeGlobal, 50 * time.Millisecond},
		{middleware.ScopeGlobal, 0},
		{middleware.ScopeGlobalStrict, 0},
		{middleware.ScopeRegion, 0},
		{middleware.ScopeRegion, 0},
	}
	for i, w := range want {
		if r := cfg.Rules[i]; r.Scope != w.scope || r.SyncInterval != w.interval {
			t.Errorf("rule %s: scope %s interval %s, want %+v", r.Name, r.Scope, r.SyncInterval, w)
		}
	}
}

func TestScopeErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"rules: [{name: a, key: ip, scope: world, limits: [{requests: 1, window: 1m}]}]",
			`rules.yaml:1: rules[0].scope: unknown scope "world" (want region, global or global_strict)`},
		{"rules: [{name: a, key: ip, scope: global, limits: [{requests: 1, window: 1m, algorithm: token_bucket}]}]",
			"rules.yaml:1: rules[0].scope: global: limits[0] is a token_bucket (scope: global takes sliding_window and fixed_window; use global_strict)"},
		{"rules: [{name: a, key: ip, scope: global, limits: [{requests: 1, window: calendar_day, algorithm: fixed_window}]}]",
			"rules.yaml:1: rules[0].scope: global: limits[0] has a calendar window (scope: global takes fixed lengths; use global_strict)"},
		{"rules: [{name: a, key: ip, scope: global, sync: lease, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].sync: lease does not apply to a rule with scope: global (it syncs across regions at sync_interval)"},
		{"rules: [{name: a, key: ip, scope: global, concurrency: 3}]",
			"rules.yaml:1: rules[0].scope: global: the rule has only a concurrency limit, which is always the region's"},
		{"rules: [{name: a, key: ip, scope: global_strict, sync_interval: 1s, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].sync_interval: applies only to a rule with sync: lease or sync: write_back"},
	} {
		_, err := config.Parse([]byte(tt.in), "rules.yaml", testEnv())
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s:\nerror %v\nwant  %s", tt.in, err, tt.want)
		}
	}
}
