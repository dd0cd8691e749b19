package config_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestCount(t *testing.T) {
	t.Parallel()
	cases := []struct {
		count string
		want  string // Count.String, or the error's text
	}{
		{`{status: [401, 403, "5xx"]}`, "status 401,403,5xx"},
		{`{status: ["401", 4xx]}`, "status 401,4xx"},
		{`{status_not: [2xx, 304]}`, "status_not 2xx,304"},
		{`{status: [401], status_not: [500]}`, "rules[0].count.status_not: status and status_not exclude each other"},
		{`{}`, "rules[0].count: empty: want status or status_not"},
		{`{status: []}`, "rules[0].count.status: empty"},
		{`{status: [600]}`, `rules[0].count.status[0]: bad status "600"`},
		{`{status: [6xx]}`, `rules[0].count.status[0]: bad status "6xx"`},
		{`{status: [0401]}`, `rules[0].count.status[0]: bad status "0401"`},
		{`{status: [[401]]}`, "rules[0].count.status[0]: want a status"},
		{`{status: 401}`, "rules[0].count.status: want a list"},
		{`{statuses: [401]}`, "rules[0].count.statuses: unknown field (want status, status_not)"},
		{`[401]`, "rules[0].count: want a mapping"},
	}
	for _, c := range cases {
		t.Run(c.count, func(t *testing.T) {
			file := "rules: [{name: login, key: ip, limits: [{requests: 5, window: 15m}], count: " + c.count + "}]"
			cfg, err := config.Parse([]byte(file), "rules.yaml", config.Env{})
			if err != nil {
				if !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %q, want it to contain %q", err, c.want)
				}
				return
			}
			if got := cfg.Rules[0].Count.String(); got != c.want {
				t.Fatalf("count %q, want %q", got, c.want)
			}
		})
	}
}

// FuzzCountStatus checks the parser of status lists: it never panics, and
// every list it accepts holds valid statuses that the Limiter accepts too.
//
//	go test -run='^$' -fuzz=FuzzCountStatus -fuzztime=30s ./middleware/config/
func FuzzCountStatus(f *testing.F) {
	for _, s := range []string{`401, 403, "5xx"`, `2xx`, `"4XX"`, `100, 599`, `600`, `-1`, `0x191`, `1e2`, `"5xx`, `&a 401, *a`, `null`, `[]`} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, list string, not bool) {
		field := "status"
		if not {
			field = "status_not"
		}
		file := "rules: [{name: login, key: ip, limits: [{requests: 5, window: 15m}], count: {" + field + ": [" + list + "]}}]"
		cfg, err := config.Parse([]byte(file), "fuzz.yaml", config.Env{})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		c := cfg.Rules[0].Count
		if c.IsZero() {
			t.Fatal("accepted an empty count")
		}
		for _, s := range append(c.Status, c.StatusNot...) {
			back, err := middleware.ParseStatus(s.String())
			if err != nil || back != s {
				t.Fatalf("status %d: String %q parses back as %d, %v", int(s), s.String(), int(back), err)
			}
		}
		lim, err := middleware.NewRules(cfg.Rules, cfg.Options()...)
		if err != nil {
			t.Fatalf("NewRules rejected an accepted count: %v", err)
		}
		_ = lim.Close()
	})
}

func TestBanField(t *testing.T) {
	t.Parallel()
	cases := []struct{ ban, want string }{
		{"1h", "1h0m0s"},
		{"90s", "1m30s"},
		{"0s", `rules[0].limits[0].ban: duration "0s" must be positive`},
		{"1000000h", "want a duration from 1ms to 3660 days"},
		{"-1m", "rules[0].limits[0].ban"},
		{"soon", "rules[0].limits[0].ban"},
	}
	for _, c := range cases {
		file := "rules: [{name: login, key: ip, limits: [{requests: 5, window: 15m, ban: " + c.ban + "}]}]"
		cfg, err := config.Parse([]byte(file), "rules.yaml", config.Env{})
		if err != nil {
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("ban %s: error %q, want %q", c.ban, err, c.want)
			}
			continue
		}
		if got := cfg.Rules[0].Limits[0].Ban.String(); got != c.want {
			t.Errorf("ban %s: %s, want %s", c.ban, got, c.want)
		}
	}
}
