package sluicetest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/sluicetest"
)

// recTB records what the helpers report instead of failing the test that
// runs them; Fatalf ends the goroutine, as testing's does.
type recTB struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recTB) Helper()        {}
func (r *recTB) Cleanup(func()) {}
func (r *recTB) Errorf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, fmt.Sprintf(f, a...))
}
func (r *recTB) Fatalf(f string, a ...any) {
	r.Errorf(f, a...)
	runtime.Goexit()
}

// run calls f with a recTB on a goroutine of its own (so that Fatalf may
// end it) and returns what it reported.
func run(f func(tb testing.TB)) []string {
	tb := &recTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msgs
}

func response(status int, fields map[string]string) *http.Response {
	h := http.Header{}
	for k, v := range fields {
		for _, one := range strings.Split(v, "\n") {
			h.Add(k, one)
		}
	}
	return &http.Response{StatusCode: status, Header: h}
}

func TestReadFields(t *testing.T) {
	t.Parallel()
	both := map[string]string{
		headers.Limit: "5", headers.Remaining: "4", headers.Reset: "120",
		headers.RateLimit: `"default";r=4;t=120`, headers.RateLimitPolicy: `"default";q=5;w=60`,
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range both {
			m[a] = b
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		fields  map[string]string
		wantErr string
	}{
		{"both styles", both, ""},
		{"draft only", map[string]string{headers.RateLimit: `"a";r=0;t=3, "b";r=7;t=1`, headers.RateLimitPolicy: `"a";q=1;w=3, "b";q=9;w=60`}, ""},
		{"legacy only", map[string]string{headers.Limit: "5", headers.Remaining: "0", headers.Reset: "1", headers.RetryAfter: "1"}, ""},
		{"none", nil, ""},
		{"remaining negative", with(headers.Remaining, "-1"), "not a non-negative integer"},
		{"remaining a decimal", with(headers.Remaining, "4.0"), "not a non-negative integer"},
		{"legacy partly", with(headers.Reset, ""), "only 2 of"},
		{"sent twice", with(headers.Remaining, "4\n4"), "sent 2 times"},
		{"retry-after a date", with(headers.RetryAfter, "Wed, 21 Oct 2015 07:28:00 GMT"), "delay-seconds"},
		{"ratelimit syntax", with(headers.RateLimit, `"default";r=4;t=`), "not a structured field list"},
		{"ratelimit without r", with(headers.RateLimit, `"default";t=4`), "no non-negative integer r"},
		{"policy without q", with(headers.RateLimitPolicy, `"default";w=60`), "no positive integer q"},
		{"unknown policy", with(headers.RateLimit, `"other";r=4;t=120`), `names policy "other"`},
		{"remaining disagrees", with(headers.Remaining, "3"), "binding RateLimit item"},
		{"limit disagrees", with(headers.Limit, "6"), `policy "default" has q=5`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sluicetest.ReadFields(response(200, tc.fields))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("ReadFields: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("ReadFields: error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestAssertionsFail(t *testing.T) {
	t.Parallel()
	denied := response(429, map[string]string{headers.Limit: "5", headers.Remaining: "0", headers.Reset: "60", headers.RetryAfter: "60"})
	allowed := response(200, map[string]string{headers.Limit: "5", headers.Remaining: "4", headers.Reset: "60"})
	for _, tc := range []struct {
		name string
		f    func(tb testing.TB)
		want string // "" for no failure
	}{
		{"allowed ok", func(tb testing.TB) { sluicetest.AssertAllowed(tb, allowed, 4) }, ""},
		{"allowed wrong count", func(tb testing.TB) { sluicetest.AssertAllowed(tb, allowed, 3) }, "says 4 left, want 3"},
		{"allowed but 429", func(tb testing.TB) { sluicetest.AssertAllowed(tb, denied, 0) }, "got 429"},
		{"allowed without fields", func(tb testing.TB) { sluicetest.AssertAllowed(tb, response(200, nil), 1) }, "no rate-limit fields"},
		{"denied ok", func(tb testing.TB) { sluicetest.AssertDenied(tb, denied, 59500*time.Millisecond) }, ""},
		{"denied wrong wait", func(tb testing.TB) { sluicetest.AssertDenied(tb, denied, 30*time.Second) }, "Retry-After is 1m0s, want 30s"},
		{"denied but 200", func(tb testing.TB) { sluicetest.AssertDenied(tb, allowed, time.Second) }, "got 200, want 429"},
		{"denied without Retry-After", func(tb testing.TB) {
			sluicetest.AssertDenied(tb, response(429, nil), time.Second)
		}, "no Retry-After"},
		{"unlimited ok", func(tb testing.TB) { sluicetest.AssertUnlimited(tb, response(200, nil)) }, ""},
		{"unlimited with fields", func(tb testing.TB) { sluicetest.AssertUnlimited(tb, allowed) }, "want no rate-limit fields"},
		{"malformed", func(tb testing.TB) {
			sluicetest.MustReadFields(tb, response(200, map[string]string{headers.Remaining: "x"}))
		}, "not a non-negative integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := run(tc.f)
			if tc.want == "" {
				if len(msgs) > 0 {
					t.Fatalf("reported %q, want nothing", msgs)
				}
				return
			}
			if len(msgs) == 0 || !strings.Contains(strings.Join(msgs, "\n"), tc.want) {
				t.Fatalf("reported %q, want a message containing %q", msgs, tc.want)
			}
		})
	}
}

// TestNetHTTP is a user's test of a net/http handler: five requests a
// minute, the sixth denied for a minute, in every header style.
func TestNetHTTP(t *testing.T) {
	t.Parallel()
	for _, style := range []headers.Style{headers.Both, headers.Legacy, headers.Draft} {
		t.Run(style.String(), func(t *testing.T) {
			t.Parallel()
			clock := sluicetest.NewClock(time.Time{})
			lim, err := middleware.New(middleware.PerMinute(5).SlidingLog(), keyfunc.RemoteIP(),
				clock.Option(), middleware.WithStore(clock.MemoryStore(t)), middleware.WithHeaderStyle(style),
				middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lim.Close() })
			h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			get := func(path, addr string) *http.Response {
				rec := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodGet, path, nil)
				r.RemoteAddr = addr
				h.ServeHTTP(rec, r)
				return rec.Result()
			}
			for i := 4; i >= 0; i-- {
				sluicetest.AssertAllowed(t, get("/", "192.0.2.1:1"), i)
				clock.Advance(time.Second)
			}
			sluicetest.AssertDenied(t, get("/", "192.0.2.1:1"), 55*time.Second)
			sluicetest.AssertAllowed(t, get("/", "192.0.2.2:1"), 4) // another client
			sluicetest.AssertUnlimited(t, get("/healthz", "192.0.2.1:1"))
			clock.Advance(55 * time.Second)
			sluicetest.AssertAllowed(t, get("/", "192.0.2.1:1"), 0) // the first request left the log
		})
	}
}

// TestEcho is the same user's test of an Echo handler.
func TestEcho(t *testing.T) {
	t.Parallel()
	clock := sluicetest.NewClock(time.Time{})
	lim, err := middleware.New(middleware.PerMinute(5).FixedWindow(), keyfunc.RemoteIP(), clock.Option())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	e := echo.New()
	e.Use(sluiceecho.RateLimiter(lim))
	e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })
	get := func() *http.Response {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		return rec.Result()
	}
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	sluicetest.Spend(t, lim, req, 3)
	if got := sluicetest.Remaining(t, lim, req); got != 2 {
		t.Fatalf("Remaining after 3 of 5: %d", got)
	}
	sluicetest.AssertAllowed(t, get(), 1)
	sluicetest.AssertAllowed(t, get(), 0)
	sluicetest.AssertDenied(t, get(), time.Minute)
	sluicetest.Reset(t, lim, req)
	sluicetest.AssertAllowed(t, get(), 4)
	clock.Advance(time.Minute)
	sluicetest.AssertAllowed(t, get(), 4)
}

func TestSpendFailsOnDeny(t *testing.T) {
	t.Parallel()
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP(), sluicetest.NewClock(time.Time{}).Option())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	msgs := run(func(tb testing.TB) { sluicetest.Spend(tb, lim, req, 3) })
	if len(msgs) != 1 || !strings.Contains(msgs[0], "request 3 of 3 was denied") {
		t.Fatalf("Spend of 3 on a limit of 2 reported %q", msgs)
	}
	if n := sluicetest.Exhaust(t, lim, req); n != 0 {
		t.Fatalf("Exhaust after the limit was spent admitted %d", n)
	}
}

func TestClock(t *testing.T) {
	t.Parallel()
	c := sluicetest.NewClock(time.Time{})
	if !c.Now().Equal(sluicetest.Epoch) {
		t.Fatalf("NewClock(zero) starts at %v, want %v", c.Now(), sluicetest.Epoch)
	}
	c.Advance(90 * time.Second)
	if got := c.Now().Sub(sluicetest.Epoch); got != 90*time.Second {
		t.Fatalf("after Advance(90s): %v past Epoch", got)
	}
	at := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	c.Set(at)
	if !c.Now().Equal(at) {
		t.Fatalf("after Set: %v", c.Now())
	}
}
