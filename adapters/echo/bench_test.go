package sluiceecho_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
)

// BenchmarkEcho measures a request to an Echo route without a limiter, with
// sluiceecho and with Echo's own RateLimiter (token bucket, memory store),
// on the allow path: one hot key (the request's peer) under a limit it
// never reaches.
func BenchmarkEcho(b *testing.B) {
	cases := []struct {
		name string
		mw   func(b *testing.B) []echo.MiddlewareFunc
	}{
		{"baseline", func(*testing.B) []echo.MiddlewareFunc { return nil }},
		{"sluice", func(b *testing.B) []echo.MiddlewareFunc {
			return []echo.MiddlewareFunc{sluiceecho.RateLimiter(limitertest.New(b, 1e9, keyfunc.RemoteIP()))}
		}},
		{"echo-ratelimiter", func(*testing.B) []echo.MiddlewareFunc {
			store := echomw.NewRateLimiterMemoryStoreWithConfig(echomw.RateLimiterMemoryStoreConfig{Rate: 1e9, Burst: 1e9})
			return []echo.MiddlewareFunc{echomw.RateLimiter(store)}
		}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			e := echo.New()
			e.GET("/users/:id", func(c echo.Context) error { return c.String(http.StatusOK, "ok") }, bc.mw(b)...)
			req := httptest.NewRequest(http.MethodGet, "/users/42", nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				e.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}
