package middleware_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestErrorTexts: the package's errors all start with "sluice: ", once,
// also when one wraps another.
func TestErrorTexts(t *testing.T) {
	t.Parallel()
	for _, err := range []error{middleware.ErrStore, middleware.ErrBreakerOpen, middleware.ErrGaveUp, middleware.ErrUnknownRule} {
		if !strings.HasPrefix(err.Error(), "sluice: ") {
			t.Errorf("%q lacks the sluice: prefix", err)
		}
	}
	lim := newLimiter(t, middleware.PerSecond(10), keyfunc.RemoteIP(),
		middleware.WithStore(&failingStore{}), middleware.WithBreaker(1, time.Hour))
	r := keyfunc.FromHTTP(get("192.0.2.1:1"))
	if _, err := lim.Decide(r); err != nil {
		t.Fatal(err) // fail open: the first failure opens the breaker
	}
	res, err := lim.Decide(r)
	if err != nil || res.Outcome != middleware.OutcomeFailedOpen {
		t.Fatalf("breaker open: %+v, %v; want failed open", res, err)
	}
	if got, want := res.StoreErr.Error(), "sluice: store failed: circuit breaker open"; got != want {
		t.Errorf("StoreErr = %q, want %q", got, want)
	}
	if !errors.Is(res.StoreErr, middleware.ErrStore) || !errors.Is(res.StoreErr, middleware.ErrBreakerOpen) {
		t.Errorf("StoreErr %v is not both ErrStore and ErrBreakerOpen", res.StoreErr)
	}
}
