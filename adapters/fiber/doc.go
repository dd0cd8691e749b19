// Package sluicefiber rate-limits Fiber (v2) handlers with a sluice Limiter.
//
// It only translates: the Limiter decides (middleware.Limiter.Decide), writes
// the rate-limit headers and builds the default responses, so a Fiber server
// answers byte for byte like a net/http one configured the same way. It reads
// fasthttp's request directly; nothing is converted to an *http.Request.
//
//	app := fiber.New()
//	app.Use(sluicefiber.New(sluicefiber.Config{Limiter: lim}))
//
// # Client addresses and Fiber's trust settings
//
// Key functions see the TCP peer as the remote address
// (c.Context().RemoteAddr()), never c.IP(): with Config.ProxyHeader set,
// c.IP() returns that header's value (its leftmost address, with
// EnableIPValidation), which the client chooses; EnableTrustedProxyCheck
// only decides whether the header is read at all. Fiber's own settings
// therefore change nothing here. keyfunc.RemoteIP keys by the
// peer; behind a reverse proxy use keyfunc.ClientIP (or
// keyfunc.TrustedProxies) with the proxies' addresses listed explicitly.
//
// # Routes
//
// The route key functions see (keyfunc.Request's Route) is c.Route().Path,
// the pattern of the route the limiter is registered on. Under app.Use that
// is the Use prefix, such as "/", for every request, since Fiber runs Use
// handlers before it matches the final route; to key by route with
// keyfunc.Route, register the limiter on the routes themselves:
//
//	app.Get("/users/:id", limit, handler)
//
// # Users and buffers
//
// keyfunc.User reads c.UserContext(), not c.Locals: an authentication
// handler that runs before the limiter should store the user with
// c.SetUserContext(ctx). The strings a keyfunc.Request returns point into
// Fiber's buffers, which Fiber reuses once the handler returns: key
// functions, Rule.Skip, CostFunc, LimitsFunc and the Limiter's hooks must
// copy what they keep. The keys key functions return are fresh strings.
//
// # After the handlers
//
// An admitted request is finished as the net/http middleware finishes it,
// once the handlers return (a panic counts as 500): its concurrency slots
// are given back, a rule that counts by outcome (middleware.Rule.Count)
// keeps or gives back its charge by the status the client gets
// (docs/logins.md), and usage limits (middleware.Rule.Usage) are settled
// from what a handler passed to middleware.Settle with c.UserContext(), or
// from the usage header, which Fiber sends only once the handlers return
// (docs/usage.md). A body streamed with SetBodyStreamWriter is written
// after that: its writer settles through the context it kept.
//
// The Limiter's net/http options WithSkip, WithDenyHandler and
// WithErrorHandler do not apply here; use the fields of Config instead.
// docs/adapters.md shows the three adapters side by side.
package sluicefiber
