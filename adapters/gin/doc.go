// Package sluicegin rate-limits Gin handlers with a sluice Limiter.
//
// It only translates: the Limiter decides (middleware.Limiter.Decide), writes
// the rate-limit headers and builds the default responses, so a Gin server
// answers byte for byte like a net/http one configured the same way.
//
//	r := gin.New()
//	r.Use(sluicegin.New(sluicegin.Config{Limiter: lim}))
//
// # Client addresses and Gin's trust settings
//
// Key functions see the TCP peer as the remote address (http.Request's
// RemoteAddr), never c.ClientIP(): Gin trusts every proxy by default
// (Engine.SetTrustedProxies, Engine.ForwardedByClientIP), so ClientIP
// returns the leftmost X-Forwarded-For entry, which the client chooses.
// Gin's own settings therefore change nothing here. keyfunc.RemoteIP keys by the peer; behind a
// reverse proxy use keyfunc.ClientIP (or keyfunc.TrustedProxies) with the
// proxies' addresses listed explicitly.
//
// # Users
//
// keyfunc.User reads the request's context (c.Request.Context()), not Gin's
// c.Keys: an authentication middleware that runs before the limiter should
// store the user with c.Request = c.Request.WithContext(ctx).
//
// # After the handlers
//
// An admitted request is finished as the net/http middleware finishes it,
// once the handlers return (a panic counts as 500): its concurrency slots
// are given back, a rule that counts by outcome (middleware.Rule.Count)
// keeps or gives back its charge by c.Writer.Status() (docs/logins.md), and
// usage limits (middleware.Rule.Usage) are settled from what a handler
// passed to middleware.Settle with c.Request.Context(), or from the usage
// header, taken off the response before it is sent (docs/usage.md).
//
// The Limiter's net/http options WithSkip, WithDenyHandler and
// WithErrorHandler do not apply here; use the fields of Config instead.
// docs/adapters.md shows the three adapters side by side.
package sluicegin
