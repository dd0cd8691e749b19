package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// chatRule limits 60 requests and 1,000 tokens a minute per client, with
// an estimate of 100 tokens and at most 800 per request.
func chatRule() middleware.Rule {
	return middleware.Rule{
		Name: "chat", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{middleware.PerMinute(60)},
		Usage: &middleware.Usage{
			Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(1000)},
			Estimate: 100, Max: 800, Header: "X-Usage-Tokens",
		},
	}
}

// usageLimiter returns a limiter of rules on store (the memory store if
// nil) with a fake clock at t0, and the Settled events it reports.
func usageLimiter(t *testing.T, store middleware.Store, rules ...middleware.Rule) (*middleware.Limiter, *settledEvents) {
	t.Helper()
	ev := &settledEvents{}
	opts := []middleware.Option{middleware.WithClock(newClock(t0).Now), middleware.WithObserver(&middleware.Hooks{
		OnSettled:     ev.add,
		OnStoreFailed: func(_ keyfunc.Request, err error) { ev.fail(err) },
	})}
	if store != nil {
		opts = append(opts, middleware.WithStore(store))
	}
	lim, err := middleware.NewRules(rules, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	return lim, ev
}

type settledEvents struct {
	mu     sync.Mutex
	events []middleware.SettleEvent
	errs   []error
}

// add records s, without its Context (the request's, which the tests
// compare events without), after checking that it has one.
func (e *settledEvents) add(s middleware.SettleEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.Context == nil {
		e.errs = append(e.errs, errors.New("a SettleEvent without the request's context"))
	}
	s.Context = nil
	e.events = append(e.events, s)
}

func (e *settledEvents) fail(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *settledEvents) take() ([]middleware.SettleEvent, []error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev, errs := e.events, e.errs
	e.events, e.errs = nil, nil
	return ev, errs
}

// chat sends a POST through h whose handler is fn, and returns the
// response.
func chat(h http.Handler) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat", nil)
	r.RemoteAddr = "192.0.2.7:1234"
	return do(h, r)
}

// TestUsageSettle walks a client through its token budget: settles from
// the handler's context and from the response header, which never
// reaches the client; both policies in the headers; a debt that denies
// with a Retry-After for the estimate; and a read of what is left.
func TestUsageSettle(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, s middleware.Store) {
		lim, ev := usageLimiter(t, s, chatRule())
		var used string // what the next handler reports, and how
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch how, n, _ := strings.Cut(used, ":"); how {
			case "ctx":
				units, _ := strconv.Atoi(n)
				if err := middleware.Settle(r.Context(), units); err != nil {
					t.Errorf("Settle: %v", err)
				}
			case "header":
				w.Header().Set("X-Usage-Tokens", n)
			}
			_, _ = io.WriteString(w, "done")
		}))

		// Admitted with an estimate of 100: 900 tokens left, then 500
		// used in all.
		used = "ctx:500"
		rr := chat(h)
		if rr.Code != 200 {
			t.Fatalf("first request: %d", rr.Code)
		}
		// Each policy's t: when its estimate stops weighing, in the
		// next window.
		if got, want := rr.Header().Get("RateLimit"), `"chat";r=59;t=120, "chat-tokens";r=900;t=61`; got != want {
			t.Errorf("RateLimit %q, want %q", got, want)
		}
		if got, want := rr.Header().Get("RateLimit-Policy"), `"chat";q=60;w=60, "chat-tokens";q=1000;w=60`; got != want {
			t.Errorf("RateLimit-Policy %q, want %q", got, want)
		}
		events, errs := ev.take()
		if len(errs) > 0 || len(events) != 1 || events[0] != (middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 500, Charged: 400}) {
			t.Fatalf("settle events %+v, errors %v", events, errs)
		}

		// 400 left; this one reports 600 in the header: 100 past the
		// limit. The header never reaches the client.
		used = "header:600"
		rr = chat(h)
		if rr.Code != 200 || rr.Header().Get("X-Usage-Tokens") != "" {
			t.Fatalf("second request: %d, usage header %q sent", rr.Code, rr.Header().Get("X-Usage-Tokens"))
		}
		events, errs = ev.take()
		if len(errs) > 0 || len(events) != 1 || events[0].Charged != 500 || events[0].Debt != 100 {
			t.Fatalf("settle events %+v, errors %v", events, errs)
		}

		// In debt: denied by the token policy, Remaining 0, and a
		// Retry-After for the estimate of 100 (the window's last tick:
		// the debt weighs until the next one ends).
		used = ""
		rr = chat(h)
		if rr.Code != http.StatusTooManyRequests {
			t.Fatalf("in debt: %d", rr.Code)
		}
		if got := rr.Header().Get("X-RateLimit-Remaining"); got != "0" {
			t.Errorf("in debt: Remaining %q", got)
		}
		ra, _ := strconv.Atoi(rr.Header().Get("Retry-After"))
		if ra < 60 || ra > 120 {
			t.Errorf("in debt: Retry-After %d s, want within the next window", ra)
		}
		if !strings.Contains(rr.Body.String(), `"policy":"chat-tokens"`) {
			t.Errorf("in debt: body %s, want the token policy", rr.Body)
		}
	})
}

// TestUsageNotSpent: a request whose estimate does not fit what is left
// of the budget is admitted on one unit while the budget is not spent,
// and charged the rest when it ends; once spent, the next is denied.
func TestUsageNotSpent(t *testing.T) {
	t.Parallel()
	lim, ev := usageLimiter(t, nil, chatRule())
	units := 0
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if units > 0 {
			_ = middleware.Settle(r.Context(), units)
		}
	}))
	// 800 and 150 of 1000, then an estimate of 100 with 50 left: admitted
	// on 1, and the rest of its estimate charged at the end (it reports
	// nothing).
	units = 800
	chat(h)
	units = 150
	chat(h)
	units = 0
	if rr := chat(h); rr.Code != 200 {
		t.Fatalf("estimate above what is left, budget not spent: %d", rr.Code)
	}
	events, _ := ev.take()
	if n := len(events); n != 3 || events[2].Charged != 99 || events[2].Units != 100 || events[2].Debt != 50 {
		t.Fatalf("events %+v: want the estimate's 99 more charged, 50 past the limit", events)
	}
	if rr := chat(h); rr.Code != http.StatusTooManyRequests {
		t.Fatalf("budget spent: %d", rr.Code)
	}
}

// TestUsageBadInput: bad settles return a clear error and change
// nothing; a settle on a denied request, or outside any, is ErrNoUsage.
func TestUsageBadInput(t *testing.T) {
	t.Parallel()
	lim, ev := usageLimiter(t, nil, chatRule())
	var errs []error
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		errs = append(errs,
			middleware.Settle(r.Context(), -1),
			middleware.Settle(r.Context(), 801), // above Max
			middleware.Settle(r.Context(), 300),
			middleware.Settle(r.Context(), 300), // twice
		)
		w.Header().Set("X-Usage-Tokens", "3e2") // and a header: twice too
	}))
	chat(h)
	want := []error{middleware.ErrBadUsage, middleware.ErrBadUsage, nil, middleware.ErrSettledTwice}
	for i := range want {
		if !errors.Is(errs[i], want[i]) || (want[i] == nil) != (errs[i] == nil) {
			t.Errorf("settle %d: %v, want %v", i, errs[i], want[i])
		}
	}
	events, failed := ev.take()
	if len(events) != 1 || events[0].Units != 300 || events[0].Charged != 200 {
		t.Errorf("events %+v: want one settle of 300", events)
	}
	if len(failed) != 1 || !errors.Is(failed[0], middleware.ErrBadUsage) || !strings.Contains(failed[0].Error(), "X-Usage-Tokens") {
		t.Errorf("reported %v: want the header's bad value", failed)
	}

	// A header that is not a number: removed, reported, the estimate stands.
	for _, v := range []string{"-5", "12.5", "lots", "1e9", strings.Repeat("9", 30)} {
		h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Usage-Tokens", v)
		}))
		if rr := chat(h); rr.Header().Get("X-Usage-Tokens") != "" {
			t.Errorf("header %q sent to the client", v)
		}
		events, failed := ev.take()
		if len(events) != 0 || len(failed) != 1 || !errors.Is(failed[0], middleware.ErrBadUsage) {
			t.Errorf("header %q: events %+v, reported %v", v, events, failed)
		}
	}

	// No usage to settle: outside a request, a rule without usage, a
	// denied request.
	if err := middleware.Settle(context.Background(), 1); !errors.Is(err, middleware.ErrNoUsage) {
		t.Errorf("Settle outside a request: %v", err)
	}
	var res middleware.Result
	if err := res.Settle(1); !errors.Is(err, middleware.ErrNoUsage) {
		t.Errorf("Settle on a zero Result: %v", err)
	}
	plain := newLimiter(t, middleware.PerMinute(10), keyfunc.RemoteIP())
	var plainErr error
	do(plain.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainErr = middleware.Settle(r.Context(), 1)
	})), get("192.0.2.1:1"))
	if !errors.Is(plainErr, middleware.ErrNoUsage) {
		t.Errorf("Settle under a rule without usage: %v", plainErr)
	}
	var deniedErr error
	deny := middleware.WithDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ := middleware.ResultFromContext(r.Context())
		deniedErr = res.Settle(5)
		w.WriteHeader(429)
	}))
	denier, err := middleware.NewRules([]middleware.Rule{chatRule()}, deny, middleware.WithClock(newClock(t0).Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = denier.Close() })
	use := denier.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = middleware.Settle(r.Context(), 800) }))
	chat(use)
	chat(use) // 1600: spent
	if rr := chat(use); rr.Code != 429 || !errors.Is(deniedErr, middleware.ErrNoUsage) {
		t.Errorf("denied request: %d, Settle %v", rr.Code, deniedErr)
	}
}

// onEachStore runs run in parallel subtests on the memory store (nil: the
// limiter's own) and on the shared Redis.
func onEachStore(t *testing.T, run func(t *testing.T, s middleware.Store)) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var s middleware.Store
			if store == "redis" {
				s = redisStoreFor(t)
			}
			run(t, s)
		})
	}
}

// TestUsageLateSettle: a usage reported after the request ended (a body
// written after the handler returned) is charged at once, and only once.
func TestUsageLateSettle(t *testing.T) {
	t.Parallel()
	lim, ev := usageLimiter(t, nil, chatRule())
	r := httptest.NewRequest(http.MethodPost, "/v1/chat", nil)
	r.RemoteAddr = "192.0.2.9:1"
	res, err := lim.Decide(keyfunc.FromHTTP(r))
	if err != nil || !res.Allowed {
		t.Fatalf("Decide: %+v %v", res, err)
	}
	res.Finish(200)
	if events, _ := ev.take(); len(events) != 0 {
		t.Fatalf("the estimate stands: events %+v", events)
	}
	if err := res.Settle(700); err != nil {
		t.Fatal(err)
	}
	if events, _ := ev.take(); len(events) != 1 || events[0].Charged != 600 {
		t.Fatalf("late settle: events %+v", events)
	}
	if err := res.Settle(700); !errors.Is(err, middleware.ErrSettledTwice) {
		t.Fatalf("late settle twice: %v", err)
	}
	res.Finish(200)
	if events, _ := ev.take(); len(events) != 0 {
		t.Fatalf("Finish again: events %+v", events)
	}
}

// TestUsageTrailer: a usage known once a streamed body is written comes as
// a trailer, read and removed when the handler returns; Flush keeps
// working through the middleware's writer.
func TestUsageTrailer(t *testing.T) {
	t.Parallel()
	lim, ev := usageLimiter(t, nil, chatRule())
	srv := httptest.NewServer(lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Usage-Tokens")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			http.NewResponseController(w).Flush()
		}
		w.Header().Set("X-Usage-Tokens", "250")
	})))
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "data: 0\n\ndata: 1\n\ndata: 2\n\n" || len(resp.TransferEncoding) == 0 {
		t.Errorf("body %q, transfer encoding %v: want it streamed", body, resp.TransferEncoding)
	}
	if v := resp.Trailer.Get("X-Usage-Tokens"); v != "" {
		t.Errorf("trailer %q sent to the client", v)
	}
	if events, errs := ev.take(); len(events) != 1 || events[0].Units != 250 || len(errs) != 0 {
		t.Errorf("events %+v, errors %v", events, errs)
	}
}

// TestUsageConfig: what a Usage may not be, with the error that says so.
func TestUsageConfig(t *testing.T) {
	t.Parallel()
	rule := func(f func(r *middleware.Rule)) []middleware.Rule {
		r := chatRule()
		u := *r.Usage
		r.Usage = &u
		f(&r)
		return []middleware.Rule{r}
	}
	for _, tt := range []struct {
		rules []middleware.Rule
		want  string
	}{
		{rule(func(r *middleware.Rule) { r.Usage.Unit = "Tokens" }), `rule "chat": usage: unit "Tokens" must match [a-z0-9_]{1,32}`},
		{rule(func(r *middleware.Rule) { r.Usage.Limits = nil }), `rule "chat": usage: no limits`},
		{rule(func(r *middleware.Rule) { r.Usage.Estimate = -1 }), `rule "chat": usage: estimate -1 is negative`},
		{rule(func(r *middleware.Rule) { r.Usage.Max = -1 }), `rule "chat": usage: max -1 is negative`},
		{rule(func(r *middleware.Rule) { r.Usage.Header = "X Usage" }), `rule "chat": usage: bad header name "X Usage"`},
		{rule(func(r *middleware.Rule) {
			r.Usage.Limits = []middleware.Limit{middleware.PerSecond(5).LeakyBucket(5, 0)}
		}), `rule "chat": usage: limits[0]: a leaky_bucket cannot settle usage`},
		{rule(func(r *middleware.Rule) {
			r.Usage.Limits = []middleware.Limit{{Requests: 10, Window: time.Minute, Ceiling: 20}}
		}), `rule "chat": usage: limits[0]: a usage limit cannot be elastic (ceiling)`},
		{rule(func(r *middleware.Rule) {
			r.Usage.Limits = []middleware.Limit{{Requests: 10, Window: time.Minute, Ban: time.Minute}}
		}), `rule "chat": usage: limits[0]: a usage limit cannot ban`},
		{rule(func(r *middleware.Rule) {
			r.Usage.Limits = []middleware.Limit{middleware.PerMinute(10), middleware.PerMinute(20)}
		}), `rule "chat": usage: two limits with window 1m; one limit per window`},
		{rule(func(r *middleware.Rule) { r.Count = middleware.Count{Status: []middleware.Status{500}} }), `rule "chat": usage: a rule cannot both count by outcome and settle usage`},
		{rule(func(r *middleware.Rule) { r.Shadow = true }), `rule "chat": usage: a shadow rule cannot settle usage`},
		{rule(func(r *middleware.Rule) { r.Usage.Limits = []middleware.Limit{{Requests: 0, Window: time.Minute}} }), `rule "chat": usage: limit 0/1m0s: requests must be > 0`},
	} {
		_, err := middleware.NewRules(tt.rules)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewRules: %v, want %q", err, tt.want)
		}
	}
	// A store that cannot settle.
	_, err := middleware.NewRules([]middleware.Rule{chatRule()}, middleware.WithStore(&failingStore{}))
	if err == nil || !strings.Contains(err.Error(), "usage needs a store that can settle") {
		t.Errorf("a store that cannot settle: %v", err)
	}
	// A rule of usage limits only.
	r := chatRule()
	r.Limits = nil
	lim, ev := usageLimiter(t, nil, r)
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = middleware.Settle(r.Context(), 20) }))
	if rr := chat(h); rr.Code != 200 || rr.Header().Get("RateLimit-Policy") != `"chat-tokens";q=1000;w=60` {
		t.Errorf("usage only: %d %v", rr.Code, rr.Header())
	}
	if events, _ := ev.take(); len(events) != 1 || events[0].Charged != -80 {
		t.Errorf("usage only: events %+v: want 80 of the estimate given back", events)
	}
}

// TestCharge charges a usage reported apart from its request: whatever
// the counter holds, into debt, which the next decision sees.
func TestCharge(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, s middleware.Store) {
		rule := middleware.Rule{Name: "stream", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(100)},
			CostFunc: func(r keyfunc.Request) int { n, _ := strconv.Atoi(r.Header("X-Tokens")); return n }}
		lim, ev := usageLimiter(t, s, rule)
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.RemoteAddr = "192.0.2.3:1"
		r.Header.Set("X-Tokens", "130")
		res, err := lim.Charge(keyfunc.FromHTTP(r))
		if err != nil || !res.Allowed || res.Remaining != 0 || res.Policy != "stream" {
			t.Fatalf("Charge: %+v %v", res, err)
		}
		if events, _ := ev.take(); len(events) != 1 || events[0].Charged != 130 || events[0].Debt != 30 {
			t.Fatalf("events %+v", events)
		}
		r.Header.Set("X-Tokens", "1")
		if res, err := lim.Decide(keyfunc.FromHTTP(r)); err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Fatalf("after a charge into debt: %+v %v", res, err)
		}
	})
	// A store that cannot settle.
	lim := newLimiter(t, middleware.PerMinute(1), keyfunc.RemoteIP(), middleware.WithStore(&failingStore{}))
	if _, err := lim.Charge(keyfunc.FromHTTP(get("192.0.2.1:1"))); err == nil {
		t.Error("Charge on a store that cannot settle: no error")
	}
}

// TestUsageStreamCancelled streams tokens as server-sent events through
// the middleware, each flushed, to clients that go away after a few: the
// handler sees its context end and settles what it produced, which is
// what is charged; a client that reads to the end is charged all of it.
func TestUsageStreamCancelled(t *testing.T) {
	t.Parallel()
	onEachStore(t, func(t *testing.T, s middleware.Store) {
		lim, ev := usageLimiter(t, s, chatRule())
		const tokens = 50
		produced := make(chan int, 8)
		srv := httptest.NewServer(lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			n := 0
			defer func() {
				produced <- n
				if err := middleware.Settle(r.Context(), n); err != nil {
					t.Errorf("Settle(%d): %v", n, err)
				}
			}()
			for n < tokens {
				if _, err := fmt.Fprintf(w, "data: token %d\n\n", n); err != nil {
					return
				}
				if err := http.NewResponseController(w).Flush(); err != nil {
					return
				}
				n++
				select {
				case <-r.Context().Done():
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		})))
		t.Cleanup(srv.Close)
		stream := func(read int) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			for i := 0; i < read; i++ {
				buf := make([]byte, len(fmt.Sprintf("data: token %d\n\n", i)))
				if _, err := io.ReadFull(resp.Body, buf); err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
			}
			cancel() // the client goes away mid-stream
		}
		stream(5)
		first := <-produced
		stream(tokens)
		second := <-produced
		if first < 5 || first >= tokens || second != tokens {
			t.Fatalf("produced %d then %d, want at least 5 but not all, then all %d", first, second, tokens)
		}
		var events []middleware.SettleEvent
		for deadline := time.Now().Add(5 * time.Second); len(events) < 2 && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			e, _ := ev.take()
			events = append(events, e...)
		}
		// Estimate 100: both give back what they did not produce.
		if len(events) != 2 || events[0].Units != first || events[0].Charged != first-100 || events[1].Units != tokens || events[1].Charged != tokens-100 {
			t.Fatalf("events %+v: want %d and %d tokens settled", events, first, tokens)
		}
	})
}
