package sluiceecho_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func TestPanicsWithoutLimiter(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func(){
		"RateLimiter":           func() { sluiceecho.RateLimiter(nil) },
		"RateLimiterWithConfig": func() { sluiceecho.RateLimiterWithConfig(sluiceecho.Config{}) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if msg, _ := recover().(string); !strings.HasPrefix(msg, "sluiceecho: ") {
					t.Errorf("recover() = %q, want a sluiceecho panic", msg)
				}
			}()
			build()
		})
	}
}

// TestUse checks the limiter mounted with Use: Echo matches the route before
// it runs the middleware, so keyfunc.Route keys by the pattern there too.
func TestUse(t *testing.T) {
	t.Parallel()
	e := echo.New()
	e.Use(sluiceecho.RateLimiter(limitertest.New(t, 1, keyfunc.Route())))
	reached := 0
	e.GET("/users/:id", func(c echo.Context) error { reached++; return nil })
	for i, want := range []int{200, 429} {
		if rec := limitertest.Get(e, "/users/"+strconv.Itoa(i)); rec.Code != want {
			t.Errorf("request %d: status %d, want %d", i, rec.Code, want)
		}
	}
	if reached != 1 {
		t.Errorf("handler reached %d times, want 1", reached)
	}
}

// TestHTTPError checks the documented way to answer through Echo's
// HTTPErrorHandler: the rate-limit headers survive it.
func TestHTTPError(t *testing.T) {
	t.Parallel()
	var gotErr error
	cfg := sluiceecho.DefaultConfig
	cfg.Limiter = limitertest.New(t, 1, keyfunc.Header("X-Tenant"))
	cfg.DenyHandler = func(c echo.Context, res middleware.Result) error {
		if res.Allowed || res.Limit.Requests != 1 || res.RetryAfter <= 0 {
			t.Errorf("DenyHandler got %+v", res)
		}
		return echo.NewHTTPError(http.StatusTooManyRequests, "rate limit exceeded")
	}
	cfg.ErrorHandler = func(c echo.Context, err error) error {
		gotErr = err
		return echo.NewHTTPError(http.StatusUnauthorized)
	}
	e := echo.New()
	e.Use(sluiceecho.RateLimiterWithConfig(cfg))
	e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, "ok") })

	if rec := limitertest.Get(e, "/", "X-Tenant", "a"); rec.Code != http.StatusOK {
		t.Errorf("first request: %d", rec.Code)
	}
	rec := limitertest.Get(e, "/", "X-Tenant", "a")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" ||
		rec.Header().Get("X-RateLimit-Limit") != "1" || !strings.Contains(rec.Body.String(), "rate limit exceeded") {
		t.Errorf("denied request: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	if rec := limitertest.Get(e, "/"); rec.Code != http.StatusUnauthorized {
		t.Errorf("request without key: %d", rec.Code)
	}
	if !errors.Is(gotErr, keyfunc.ErrNoKey) {
		t.Errorf("ErrorHandler saw %v, want ErrNoKey", gotErr)
	}
}

// TestRemoteAddrIsPeer checks that the key is the peer, not c.RealIP(),
// which returns the leftmost X-Forwarded-For entry.
func TestRemoteAddrIsPeer(t *testing.T) {
	t.Parallel()
	var keys []string
	key := func(r keyfunc.Request) (string, error) {
		k, err := keyfunc.RemoteIP()(r)
		keys = append(keys, k)
		return k, err
	}
	e := echo.New()
	e.Use(sluiceecho.RateLimiter(limitertest.New(t, 10, key)))
	e.GET("/", func(c echo.Context) error { return nil })
	limitertest.Get(e, "/", "X-Forwarded-For", "203.0.113.9, 198.51.100.1", "X-Real-IP", "203.0.113.8")
	if len(keys) != 1 || keys[0] != "ip:192.0.2.1" { // httptest.NewRequest's peer
		t.Errorf("keys = %q, want [ip:192.0.2.1]", keys)
	}
}
