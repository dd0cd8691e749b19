package sluicegin_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
)

// BenchmarkGin measures a request to a Gin route without a limiter and with
// sluicegin in front of it, on the allow path: one hot key (the request's
// peer) under a limit it never reaches. Gin has no limiter of its own.
func BenchmarkGin(b *testing.B) {
	cases := []struct {
		name string
		mw   func(b *testing.B) []gin.HandlerFunc
	}{
		{"baseline", func(*testing.B) []gin.HandlerFunc { return nil }},
		{"sluice", func(b *testing.B) []gin.HandlerFunc {
			return []gin.HandlerFunc{sluicegin.New(sluicegin.Config{Limiter: limitertest.New(b, 1e9, keyfunc.RemoteIP())})}
		}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			r := gin.New()
			r.GET("/users/:id", append(bc.mw(b), func(c *gin.Context) { c.String(http.StatusOK, "ok") })...)
			req := httptest.NewRequest(http.MethodGet, "/users/42", nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				r.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}
