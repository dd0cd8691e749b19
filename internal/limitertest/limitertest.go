// Package limitertest holds helpers shared by the tests of the front ends
// (the Gin, Echo and Fiber adapters): a limiter closed when the test
// ends (New) and a GET served on a handler and recorded (Get).
package limitertest

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// New returns a limiter of n requests a minute per key, closed when the
// test ends.
func New(tb testing.TB, n int, key keyfunc.Func, opts ...middleware.Option) *middleware.Limiter {
	tb.Helper()
	lim, err := middleware.New(middleware.PerMinute(n), key, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lim.Close() })
	return lim
}

// Get serves a GET of target with the given header name/value pairs on h
// and returns the recorded response.
func Get(h http.Handler, target string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
