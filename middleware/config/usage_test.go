package config_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	good := `{unit: tokens, limits: [{requests: 10000, window: 1m}, {requests: 500000, window: calendar_day}], time_zone: Europe/Paris, estimate: 200, max: 4000, header: X-Usage-Tokens}`
	cfg, err := config.Parse([]byte("rules: [{name: chat, key: ip, limits: [{requests: 60, window: 1m}], usage: "+good+"}]"), "rules.yaml", config.Env{})
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Rules[0].Usage
	if u == nil || u.Unit != "tokens" || u.Estimate != 200 || u.Max != 4000 || u.Header != "X-Usage-Tokens" || len(u.Limits) != 2 ||
		u.Limits[0] != middleware.PerMinute(10000) || u.Limits[1].Period != middleware.CalendarDay || u.Limits[1].Location.String() != "Europe/Paris" {
		t.Fatalf("usage %+v", u)
	}
	if _, err := middleware.NewRules(cfg.Rules, cfg.Options()...); err != nil {
		t.Fatal(err)
	}
	// A rule of usage limits only.
	if _, err := config.Parse([]byte("rules: [{name: chat, key: ip, usage: {unit: tokens, limits: [{requests: 100, window: 1h}]}}]"), "rules.yaml", config.Env{}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct{ usage, want string }{
		{`{limits: [{requests: 1, window: 1m}]}`, "rules[0].usage.unit: required"},
		{`{unit: tokens}`, "rules[0].usage.limits: required"},
		{`{unit: Tokens, limits: [{requests: 1, window: 1m}]}`, `rules[0].usage.unit: bad unit "Tokens"`},
		{`{unit: tokens, limits: []}`, "rules[0].usage.limits: empty"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], estimate: 0}`, "rules[0].usage.estimate: 0 must be at least 1"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], max: -3}`, "rules[0].usage.max: -3 must be at least 1"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], header: "X Usage"}`, `rules[0].usage.header: bad header name "X Usage"`},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], algorithm: leaky_bucket}`, "rules[0].usage.algorithm: leaky_bucket queues requests"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m, algorithm: leaky_bucket}]}`, "rules[0].usage.limits[0]: leaky_bucket queues requests"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m, ban: 1h}]}`, "rules[0].usage.limits[0].ban: a usage limit cannot ban"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], time_zone: UTC}`, "rules[0].usage.time_zone: no usage limit has a calendar window"},
		{`{unit: tokens, limits: [{requests: 1, window: 1m}], tokens: 5}`, "rules[0].usage.tokens: unknown field"},
		{`[tokens]`, "rules[0].usage: want a mapping"},
	} {
		file := "rules: [{name: chat, key: ip, limits: [{requests: 60, window: 1m}], usage: " + c.usage + "}]"
		_, err := config.Parse([]byte(file), "rules.yaml", config.Env{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("usage %s: error %v, want it to contain %q", c.usage, err, c.want)
		}
	}
	// A rule that counts by outcome cannot settle usage: the Limiter's
	// check, with the file's position.
	_, err = config.Parse([]byte("rules: [{name: chat, key: ip, limits: [{requests: 60, window: 1m}], count: {status: [500]}, usage: {unit: tokens, limits: [{requests: 1, window: 1m}]}}]"), "rules.yaml", config.Env{})
	if err == nil || !strings.Contains(err.Error(), "cannot both count by outcome and settle usage") {
		t.Errorf("count and usage: %v", err)
	}
}
