package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// banRules is 2 requests a minute per address on /login, then a ban of an
// hour.
func banRules() []middleware.Rule {
	l := middleware.PerMinute(2)
	l.Ban = time.Hour
	return []middleware.Rule{{Name: "login", Path: "/login", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{l}}}
}

func doFrom(h http.Handler, addr, path string) *httptest.ResponseRecorder {
	rr := httptest.NewRecorder()
	req := httptest.NewRequest("POST", path, nil)
	req.RemoteAddr = addr
	h.ServeHTTP(rr, req)
	return rr
}

// TestBan follows a ban with a fake clock: it starts when the limit
// refuses, lasts its length whatever the window says, is lifted by
// LiftBan, and Retry-After and RateLimit say how long it has left.
func TestBan(t *testing.T) {
	t.Parallel()
	type step struct {
		advance    time.Duration
		addr       string
		lift       bool
		status     int
		retryAfter string // "" when absent
		rateLimit  string
	}
	const a, b = "192.0.2.1:1", "192.0.2.2:1"
	steps := []step{
		{0, a, false, 200, "", `"login";r=1;t=120`},
		{time.Second, a, false, 200, "", `"login";r=0;t=89`},
		// Refused: banned for an hour from now.
		{time.Second, a, false, 429, "3600", `"login";r=0;t=3600`},
		// The window would admit again; the ban does not.
		{2 * time.Minute, a, false, 429, "3480", `"login";r=0;t=3480`},
		{0, b, false, 200, "", `"login";r=1;t=120`}, // another client is not banned
		{57 * time.Minute, a, false, 429, "60", `"login";r=0;t=60`},
		// The ban ends after its hour.
		{time.Minute, a, false, 200, "", `"login";r=1;t=120`},
		{0, a, false, 200, "", `"login";r=0;t=90`},
		{0, a, false, 429, "3600", `"login";r=0;t=3600`},
		// Lifted, at once: the client starts afresh.
		{0, a, true, 200, "", `"login";r=1;t=120`}, // and the counters with it
	}
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			opts := []middleware.Option{middleware.WithClock(clk.Now), middleware.WithHeaderStyle(headers.Both)}
			if store == "redis" {
				opts = append(opts, middleware.WithStore(redisStoreFor(t)))
			}
			lim, err := middleware.NewRules(banRules(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lim.Close() })
			h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			for i, st := range steps {
				clk.Add(st.advance)
				if st.lift {
					if ok, err := lim.LiftBan(context.Background(), "login", "ip:192.0.2.1"); !ok || err != nil {
						t.Fatalf("step %d: LiftBan = %v, %v", i, ok, err)
					}
				}
				rr := doFrom(h, st.addr, "/login")
				if rr.Code != st.status || rr.Header().Get("Retry-After") != st.retryAfter || rr.Header().Get("RateLimit") != st.rateLimit {
					t.Fatalf("step %d: %d Retry-After %q RateLimit %q; want %d %q %q (body %s)", i, rr.Code,
						rr.Header().Get("Retry-After"), rr.Header().Get("RateLimit"), st.status, st.retryAfter, st.rateLimit, rr.Body)
				}
				if i == 2 {
					bans, total, err := lim.Bans(context.Background(), 0)
					if err != nil || total != 1 || len(bans) != 1 || bans[0].Key != "ip:192.0.2.1" || bans[0].Rule != "login" || !bans[0].Until.Equal(clk.Now().Add(time.Hour)) {
						t.Fatalf("Bans = %+v, %d, %v", bans, total, err)
					}
				}
			}
			if ok, _ := lim.LiftBan(context.Background(), "login", "ip:192.0.2.1"); ok {
				t.Error("LiftBan of a lifted ban reported one")
			}
			if _, err := lim.LiftBan(context.Background(), "nope", "ip:192.0.2.1"); !errors.Is(err, middleware.ErrUnknownRule) {
				t.Errorf("LiftBan of an unknown rule: %v", err)
			}
		})
	}
}

// TestBanFleet checks that a ban started on one app server refuses the
// client on another that shares the Redis, and that lifting it on a third
// reaches both within the sync interval.
func TestBanFleet(t *testing.T) {
	t.Parallel()
	store := redisStoreFor(t)
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	var hs [3]http.Handler
	var lims [3]*middleware.Limiter
	for i := range lims {
		lim, err := middleware.NewRules(banRules(), middleware.WithStore(store), middleware.WithClock(clk.Now), middleware.WithClientSync(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lim.Close() })
		lims[i], hs[i] = lim, lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	}
	const a = "192.0.2.9:1"
	for i, want := range []int{200, 200, 429} {
		if rr := doFrom(hs[0], a, "/login"); rr.Code != want {
			t.Fatalf("request %d on server 0: %d, want %d", i, rr.Code, want)
		}
	}
	clk.Add(2 * time.Minute) // the window would admit again
	for i := 1; i < 3; i++ {
		if rr := doFrom(hs[i], a, "/login"); rr.Code != 429 || rr.Header().Get("Retry-After") != "3480" {
			t.Fatalf("server %d: %d Retry-After %q, want the ban's 429 and 3480", i, rr.Code, rr.Header().Get("Retry-After"))
		}
	}
	if ok, err := lims[2].LiftBan(context.Background(), "login", "ip:192.0.2.9"); !ok || err != nil {
		t.Fatalf("LiftBan = %v, %v", ok, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 2; i++ {
		for doFrom(hs[i], a, "/login").Code != 200 {
			if time.Now().After(deadline) {
				t.Fatalf("server %d still refuses the client 5 s after the ban was lifted", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestBanKeptLocally: an app server that has seen a ban refuses the
// client without asking Redis again, so the ban holds even while Redis is
// down (where the limiter would otherwise fail open).
func TestBanKeptLocally(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	lim, err := middleware.NewRules(banRules(), middleware.WithStore(store), middleware.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for i, want := range []int{200, 200, 429} {
		if rr := doFrom(h, "192.0.2.1:1", "/login"); rr.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rr.Code, want)
		}
	}
	srv.Kill()
	clk.Add(time.Minute)
	if rr := doFrom(h, "192.0.2.1:1", "/login"); rr.Code != 429 || rr.Header().Get("Retry-After") != "3540" {
		t.Fatalf("banned client with Redis down: %d Retry-After %q, want 429 3540", rr.Code, rr.Header().Get("Retry-After"))
	}
	// Another client fails open, as the policy says.
	if rr := doFrom(h, "192.0.2.2:1", "/login"); rr.Code != 200 {
		t.Fatalf("another client with Redis down: %d, want 200 (fail open)", rr.Code)
	}
}

// TestLogObserverBan: a ban is logged once a second per rule, without the
// client's key.
func TestLogObserverBan(t *testing.T) {
	t.Parallel()
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	lim, err := middleware.NewRules(banRules(), middleware.WithObserver(middleware.NewLogObserver(log)))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, addr := range []string{"192.0.2.1:1", "192.0.2.2:1"} {
		for range 3 {
			doFrom(h, addr, "/login")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	out := buf.String()
	if n := strings.Count(out, "sluice: client banned"); n != 1 || !strings.Contains(out, "rule=login") || !strings.Contains(out, "for=1h0m0s") || strings.Contains(out, "192.0.2") {
		t.Errorf("logged %d times:\n%s", n, out)
	}
}
