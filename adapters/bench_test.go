package adapters_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// BenchmarkNetHTTP is the reference for the adapters' benchmarks: the same
// route and limiter served by net/http's Limiter.Handler, on the allow path
// with one hot key.
func BenchmarkNetHTTP(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", okContentType)
		_, _ = w.Write([]byte("ok"))
	})
	cases := []struct {
		name string
		wrap func(b *testing.B, h http.Handler) http.Handler
	}{
		{"baseline", func(_ *testing.B, h http.Handler) http.Handler { return h }},
		{"sluice", func(b *testing.B, h http.Handler) http.Handler {
			lim, err := middleware.New(middleware.PerMinute(1e9), keyfunc.RemoteIP())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = lim.Close() })
			return lim.Handler(h)
		}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			mux := http.NewServeMux()
			mux.Handle("GET /users/{id}", bc.wrap(b, ok))
			req := httptest.NewRequest(http.MethodGet, "/users/42", nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}
