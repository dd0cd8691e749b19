package config_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestSyncKeys(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse([]byte(`rules:
  - {name: a, key: ip, sync: lease, lease: 20, sync_interval: 250ms, limits: [{requests: 100, window: 1m}]}
  - {name: b, key: ip, sync: write_back, max_unsynced: 5, limits: [{requests: 10, window: 1s, algorithm: token_bucket}]}
  - {name: c, key: ip, sync: exact, limits: [{requests: 10, window: 1d, algorithm: fixed_window}]}
  - {name: d, key: ip, limits: [{requests: 10, window: 1s}]}
`), "rules.yaml", testEnv())
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		mode       middleware.SyncMode
		lease, max int
		interval   time.Duration
	}{
		{middleware.SyncLease, 20, 0, 250 * time.Millisecond},
		{middleware.SyncWriteBack, 0, 5, 0},
		{middleware.SyncExact, 0, 0, 0},
		{middleware.SyncExact, 0, 0, 0},
	}
	for i, w := range want {
		r := cfg.Rules[i]
		if r.Sync != w.mode || r.Lease != w.lease || r.MaxUnsynced != w.max || r.SyncInterval != w.interval {
			t.Errorf("rule %s: sync %s lease %d max_unsynced %d interval %s, want %+v", r.Name, r.Sync, r.Lease, r.MaxUnsynced, r.SyncInterval, w)
		}
	}
}

func TestSyncErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"rules: [{name: a, key: ip, sync: writeback, limits: [{requests: 1, window: 1m}]}]",
			`rules.yaml:1: rules[0].sync: unknown sync mode "writeback" (want exact, lease or write_back)`},
		{"rules: [{name: a, key: ip, sync: lease, limits: [{requests: 1, window: 1m, algorithm: sliding_log}]}]",
			"rules.yaml:1: rules[0].sync: lease: limits[0] is a sliding_log, which is always decided exactly (sync: lease and write_back take sliding_window, fixed_window and token_bucket)"},
		{"rules: [{name: a, key: ip, sync: write_back, limits: [{requests: 1, window: 1m, algorithm: leaky_bucket}]}]",
			"rules.yaml:1: rules[0].sync: write_back: limits[0] is a leaky_bucket, which is always decided exactly (sync: lease and write_back take sliding_window, fixed_window and token_bucket)"},
		{"rules: [{name: a, key: ip, sync: lease, concurrency: 3}]",
			"rules.yaml:1: rules[0].sync: lease: the rule has only a concurrency limit, which is always decided exactly"},
		{"rules: [{name: a, key: ip, lease: 5, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].lease: applies only to a rule with sync: lease"},
		{"rules: [{name: a, key: ip, sync: lease, max_unsynced: 5, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].max_unsynced: applies only to a rule with sync: write_back"},
		{"rules: [{name: a, key: ip, sync_interval: 1s, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].sync_interval: applies only to a rule with sync: lease or sync: write_back"},
		{"rules: [{name: a, key: ip, sync: lease, lease: 0, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].lease: 0 must be between 1 and 2^30"},
		{"rules: [{name: a, key: ip, sync: write_back, sync_interval: 2h, limits: [{requests: 1, window: 1m}]}]",
			"rules.yaml:1: rules[0].sync_interval: 2h0m0s is longer than 1h"},
	} {
		_, err := config.Parse([]byte(tt.in), "rules.yaml", testEnv())
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s:\nerror %v\nwant  %s", tt.in, err, tt.want)
		}
	}
}
