package middleware_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// outcomes records what Observer.Decided reports.
type outcomes struct {
	mu  sync.Mutex
	got []middleware.Outcome
}

func (o *outcomes) record(_ keyfunc.Request, res *middleware.Result) {
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
// Observer.Decided exactly once, with its outcome, whatever the store does
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
			lim, err := middleware.NewRules(rules(), append(tt.opts, middleware.WithClock(newClock(t0).Now), middleware.WithObserver(&middleware.Hooks{OnDecided: o.record}))...)
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

// recorder is an Observer that counts what it is told.
type recorder struct {
	middleware.NopObserver
	mu                           sync.Mutex
	decided, calls, errs, cached int
	breaker                      []bool
}

func (r *recorder) Decided(keyfunc.Request, *middleware.Result) {
	r.mu.Lock()
	r.decided++
	r.mu.Unlock()
}
func (r *recorder) StoreCalled(_ time.Duration, err error) {
	r.mu.Lock()
	r.calls++
	if err != nil {
		r.errs++
	}
	r.mu.Unlock()
}
func (r *recorder) DenyCacheHit(string) { r.mu.Lock(); r.cached++; r.mu.Unlock() }
func (r *recorder) BreakerChanged(open bool) {
	r.mu.Lock()
	r.breaker = append(r.breaker, open)
	r.mu.Unlock()
}

// TestObserverAndLogger: observers hear every decision, store call, deny
// cache hit and breaker change; the logger logs store failures (rate
// limited), the breaker, and never a key in clear.
func TestObserverAndLogger(t *testing.T) {
	t.Parallel()
	var rec recorder
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&syncWriter{w: &buf}, nil))
	store := &failingStore{}
	lim := newLimiter(t, middleware.PerMinute(1), keyfunc.RemoteIP(), middleware.WithStore(store),
		middleware.WithBreaker(2, time.Hour), middleware.WithObserver(&rec), middleware.WithObserver(middleware.NewLogObserver(logger)))
	h := lim.Handler(ok)
	for range 5 {
		do(h, get("192.0.2.99:1"))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.decided != 5 || rec.calls != 2 || rec.errs != 2 || !slices.Equal(rec.breaker, []bool{true}) {
		t.Errorf("observer: %d decided, %d calls (%d failed), breaker %v; want 5, 2 (2), [true]", rec.decided, rec.calls, rec.errs, rec.breaker)
	}
	if st := lim.Stats(); !st.BreakerOpen {
		t.Errorf("Stats: %+v, want the breaker open", st)
	}
	out := buf.String()
	for _, want := range []string{"sluice: store call failed", "sluice: circuit breaker open", "sluice: store failed, request let through unlimited"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "store call failed") != 1 {
		t.Errorf("store failures not rate limited:\n%s", out)
	}
	if strings.Contains(out, "192.0.2.99") {
		t.Errorf("the log shows a client key:\n%s", out)
	}

	// A memory store: denials sampled with the key hashed, deny cache off.
	var buf2 bytes.Buffer
	lim2, err := middleware.NewRules([]middleware.Rule{{Name: "r", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)}}},
		middleware.WithObserver(middleware.NewLogObserver(slog.New(slog.NewTextHandler(&syncWriter{w: &buf2}, nil)))))
	if err != nil {
		t.Fatal(err)
	}
	defer lim2.Close()
	for range 1000 {
		do(lim2.Handler(ok), get("192.0.2.98:1"))
	}
	if n := strings.Count(buf2.String(), "request denied (sampled)"); n < 1 || n > 40 {
		t.Errorf("%d denials logged of 999, want about 10:\n%s", n, buf2.String())
	}
	if strings.Contains(buf2.String(), "192.0.2.98") || !strings.Contains(buf2.String(), "key_hash=") {
		t.Errorf("denials must be logged with the key hashed:\n%.500s", buf2.String())
	}
	if st := lim2.Stats(); st.MemoryKeys != 1 {
		t.Errorf("Stats: %+v, want 1 memory key", st)
	}
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
