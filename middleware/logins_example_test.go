package middleware_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// Failed logins count, successful ones are free; the third failure in a
// minute is refused and bans the client for an hour.
func ExampleCount() {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "login", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{{Requests: 2, Window: time.Minute, Ban: time.Hour}},
		Count:  middleware.Count{Status: []middleware.Status{http.StatusUnauthorized}},
	}}, middleware.WithClock(func() time.Time { return at }))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("password") != "secret" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	for _, password := range []string{"secret", "secret", "secret", "guess", "guess", "guess", "secret"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/login?password="+password, nil))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Println(password, rec.Code, "Retry-After:", ra)
			continue
		}
		fmt.Println(password, rec.Code)
	}
	// Output:
	// secret 200
	// secret 200
	// secret 200
	// guess 401
	// guess 401
	// guess 429 Retry-After: 3600
	// secret 429 Retry-After: 3600
}

// An override gives one client other limits, at run time, for a day.
func ExampleLimiter_SetOverride() {
	lim, err := middleware.New(middleware.PerMinute(10), keyfunc.RemoteIP())
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	quota := func(addr string) string {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = addr
		h.ServeHTTP(rec, req)
		return rec.Header().Get("X-RateLimit-Limit")
	}
	ctx := context.Background()
	err = lim.SetOverride(ctx, middleware.Override{
		Rule: middleware.DefaultRuleName, Key: "ip:192.0.2.1",
		Limits: []middleware.Limit{middleware.PerMinute(1000)},
		Until:  time.Now().Add(24 * time.Hour),
	})
	fmt.Println(err, quota("192.0.2.1:1234"), quota("192.0.2.2:1234"))
	// Bad input changes nothing.
	fmt.Println(lim.SetOverride(ctx, middleware.Override{Rule: "nope", Key: "ip:192.0.2.1", Limits: []middleware.Limit{middleware.PerMinute(5)}}))
	fmt.Println(lim.SetOverride(ctx, middleware.Override{Rule: middleware.DefaultRuleName, Key: "ip:192.0.2.1"}), len(lim.Overrides()))
	// Output:
	// <nil> 1000 10
	// sluice: unknown rule "nope"
	// sluice: override of rule "default": no limits 1
}
