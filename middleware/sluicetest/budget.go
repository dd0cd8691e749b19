package sluicetest

import (
	"net/http"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// MaxExhaust is how many requests Exhaust sends at most before it gives
// up: a limit that admits more is not one a unit test should exhaust.
const MaxExhaust = 1 << 20

// Spend decides n requests like r through lim, as its Handler would,
// without running a handler, and fails the test if one of them is denied
// or fails. It returns the Result of the last one. Use it to bring a
// client near its limit before the request the test is about.
func Spend(tb testing.TB, lim *middleware.Limiter, r *http.Request, n int) middleware.Result {
	tb.Helper()
	var res middleware.Result
	for i := 1; i <= n; i++ {
		var err error
		res, err = lim.Decide(keyfunc.FromHTTP(r))
		if err != nil {
			tb.Fatalf("sluicetest: Spend: request %d of %d: %v", i, n, err)
		}
		res.Finish(http.StatusOK)
		if !res.Allowed {
			tb.Fatalf("sluicetest: Spend: request %d of %d was denied by %q (limit %d, retry after %v)",
				i, n, res.Policy, res.Limit.Requests, res.RetryAfter)
		}
	}
	return res
}

// Exhaust decides requests like r through lim until one is denied, and
// returns how many were admitted before it. It fails the test if a request
// fails, or if none is denied within MaxExhaust requests.
func Exhaust(tb testing.TB, lim *middleware.Limiter, r *http.Request) int {
	tb.Helper()
	for n := 0; n < MaxExhaust; n++ {
		res, err := lim.Decide(keyfunc.FromHTTP(r))
		if err != nil {
			tb.Fatalf("sluicetest: Exhaust: request %d: %v", n+1, err)
		}
		res.Finish(http.StatusOK)
		if !res.Allowed {
			return n
		}
	}
	tb.Fatalf("sluicetest: Exhaust: no request was denied in %d", MaxExhaust)
	return 0
}

// Peek reports where every limit that applies to requests like r stands,
// without charging anything (Limiter.Keys, then Limiter.Peek for each rule
// and key). It fails the test on an error.
func Peek(tb testing.TB, lim *middleware.Limiter, r *http.Request) []middleware.LimitState {
	tb.Helper()
	keys, err := lim.Keys(keyfunc.FromHTTP(r))
	if err != nil {
		tb.Fatalf("sluicetest: Peek: %v", err)
	}
	var states []middleware.LimitState
	for _, k := range keys {
		s, err := lim.Peek(r.Context(), k.Rule, k.Key)
		if err != nil {
			tb.Fatalf("sluicetest: Peek %q %q: %v", k.Rule, k.Key, err)
		}
		states = append(states, s...)
	}
	return states
}

// Remaining returns how many more requests like r are admitted now: the
// fewest Remaining of the limits Peek reports. It fails the test if no
// limit applies to r.
func Remaining(tb testing.TB, lim *middleware.Limiter, r *http.Request) int {
	tb.Helper()
	states := Peek(tb, lim, r)
	if len(states) == 0 {
		tb.Fatalf("sluicetest: Remaining: no limit applies to %s %s", r.Method, r.URL.Path)
	}
	least := states[0].Remaining
	for _, s := range states[1:] {
		least = min(least, s.Remaining)
	}
	return least
}

// Reset forgets the counters of the client of r under every rule that
// applies to it (Limiter.Reset), so that it starts afresh. It fails the
// test on an error.
func Reset(tb testing.TB, lim *middleware.Limiter, r *http.Request) {
	tb.Helper()
	keys, err := lim.Keys(keyfunc.FromHTTP(r))
	if err != nil {
		tb.Fatalf("sluicetest: Reset: %v", err)
	}
	for _, k := range keys {
		if err := lim.Reset(r.Context(), k.Rule, k.Key); err != nil {
			tb.Fatalf("sluicetest: Reset %q %q: %v", k.Rule, k.Key, err)
		}
	}
}
