package middleware_test

import (
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// outcomes records what WithOnDecision reports.
type outcomes struct {
	mu  sync.Mutex
	got []middleware.Outcome
}

func (o *outcomes) record(_ keyfunc.Request, res middleware.Result) {
	o.mu.Lock()
	o.got = append(o.got, res.Outcome)
	o.mu.Unlock()
}

func (o *outcomes) take() []middleware.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.got
	o.got = nil
	return got
}

// TestEveryDecisionObserved: every request Decide handles reaches
// WithOnDecision exactly once, with its outcome, whatever the store does
// and whatever the failure policy, the breaker included.
func TestEveryDecisionObserved(t *testing.T) {
	t.Parallel()
	rules := func() []middleware.Rule {
		return []middleware.Rule{
			{Name: "api", Path: "/api/*", Key: keyfunc.Header("X-Key"), Limits: []middleware.Limit{middleware.PerMinute(2)}},
			{Name: "trial", Path: "/trial", Key: keyfunc.RemoteIP(), Shadow: true, Limits: []middleware.Limit{middleware.PerMinute(1)}},
		}
	}
	const (
		A  = middleware.OutcomeAllowed
		D  = middleware.OutcomeDenied
		S  = middleware.OutcomeShadowDenied
		FO = middleware.OutcomeFailedOpen
		FB = middleware.OutcomeFallback
		NK = middleware.OutcomeNoKey
		E  = middleware.OutcomeError
		U  = middleware.OutcomeUnlimited
	)
	// Each request: a path and whether it carries a key.
	type req struct {
		path string
		key  bool
	}
	reqs := []req{{"/api/x", true}, {"/api/x", true}, {"/api/x", true}, {"/api/x", false}, {"/other", false}, {"/trial", false}, {"/trial", false}}
	tests := []struct {
		name string
		opts []middleware.Option
		want []middleware.Outcome
	}{
		{"memory", nil, []middleware.Outcome{A, A, D, NK, U, A, S}},
		{"store down, fail open", []middleware.Option{middleware.WithStore(&failingStore{})},
			[]middleware.Outcome{FO, FO, FO, NK, U, A, A}}, // shadow-only rules: nothing enforced, nothing failed open
		{"store down, fail closed", []middleware.Option{middleware.WithStore(&failingStore{}), middleware.WithFailurePolicy(middleware.FailClosed)},
			[]middleware.Outcome{E, E, E, NK, U, A, A}},
		{"store down, fail local", []middleware.Option{middleware.WithStore(&failingStore{}), middleware.WithFailurePolicy(middleware.FailLocal)},
			[]middleware.Outcome{FB, FB, FB, NK, U, A, A}},
		{"store down, breaker open", []middleware.Option{middleware.WithStore(&failingStore{}), middleware.WithBreaker(1, 1<<40)},
			[]middleware.Outcome{FO, FO, FO, NK, U, A, A}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var o outcomes
			lim, err := middleware.NewRules(rules(), append(tt.opts, middleware.WithClock(newClock(t0).Now), middleware.WithOnDecision(o.record))...)
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			h := lim.Handler(ok)
			for _, r := range reqs {
				hr := httptest.NewRequest("GET", r.path, nil)
				if r.key {
					hr.Header.Set("X-Key", "k1")
				}
				do(h, hr)
			}
			got := o.take()
			if len(got) != len(tt.want) {
				t.Fatalf("%d decisions reported for %d requests: %v", len(got), len(reqs), got)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("request %d (%s): outcome %v, want %v", i, reqs[i].path, got[i], tt.want[i])
				}
			}
		})
	}
}
