// Package sluiceecho rate-limits Echo (v4) handlers with a sluice Limiter.
//
// It only translates: the Limiter decides (middleware.Limiter.Decide), writes
// the rate-limit headers and builds the default responses, so an Echo server
// answers byte for byte like a net/http one configured the same way.
//
//	e := echo.New()
//	e.Use(sluiceecho.RateLimiter(lim))
//
// # Client addresses and Echo's trust settings
//
// Key functions see the TCP peer as the remote address (http.Request's
// RemoteAddr), never c.RealIP(): without Echo.IPExtractor, RealIP returns
// the leftmost X-Forwarded-For entry, which any client can choose. Echo's
// IPExtractor therefore changes nothing here. keyfunc.RemoteIP keys by the
// peer; behind a reverse proxy use keyfunc.ClientIP (or
// keyfunc.TrustedProxies) with the proxies' addresses listed explicitly.
//
// # Users
//
// keyfunc.User reads the request's context (c.Request().Context()), not
// Echo's c.Get: an authentication middleware that runs before the limiter
// should store the user with c.SetRequest(c.Request().WithContext(ctx)).
//
// # Responses
//
// By default a denied request gets 429 with middleware.DenyBody and a
// request that cannot be decided middleware.ErrorResponse, written directly
// so that every front end sends the same bytes. To go through Echo's
// HTTPErrorHandler instead, return an error:
//
//	cfg := sluiceecho.DefaultConfig
//	cfg.Limiter = lim
//	cfg.DenyHandler = func(c echo.Context, res middleware.Result) error {
//		return echo.NewHTTPError(http.StatusTooManyRequests, "rate limit exceeded")
//	}
//	e.Use(sluiceecho.RateLimiterWithConfig(cfg))
//
// The rate-limit headers and Retry-After are set before DenyHandler runs and
// Echo's default HTTPErrorHandler keeps them.
//
// # After the handlers
//
// An admitted request is finished as the net/http middleware finishes it,
// once the handlers return (a panic counts as 500): its concurrency slots
// are given back, a rule that counts by outcome (middleware.Rule.Count)
// keeps or gives back its charge by the status the client gets
// (docs/logins.md), and usage limits (middleware.Rule.Usage) are settled
// from what a handler passed to middleware.Settle with
// c.Request().Context(), or from the usage header, taken off the response
// before it is sent (docs/usage.md).
//
// The Limiter's net/http options WithSkip, WithDenyHandler and
// WithErrorHandler do not apply here; use the fields of Config instead.
// docs/adapters.md shows the three adapters side by side.
package sluiceecho
