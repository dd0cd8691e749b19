// Package envoyrls serves sluice's limiter as Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService).
//
// Server answers ShouldRateLimit for proxies (Envoy, Istio, and others
// that speak the same API) from the Envoy/Lyft descriptor files that
// package config reads, parsed with config.Env.RateLimitService, with the
// same limiter, stores and failure policies as sluice's HTTP middleware:
//
//	env := config.Env{RateLimitService: true}
//	rl, err := config.Open("ratelimit.yaml", env, middleware.WithStore(store))
//	...
//	srv, err := envoyrls.NewServer(envoyrls.Options{}, rl)
//	g := grpc.NewServer()
//	srv.Register(g)
//
// Each descriptor is decided by its own Limiter.Decide, and hits_addend
// is its cost. A descriptor marked usage: true in the file is a budget of
// usage reported when a stream ends (Envoy's apply_on_stream_done): the
// call that checks it is refused only once the budget is spent, and the
// call at the end is charged whatever the counter holds, which may leave
// the client a debt it waits off (docs/usage.md).
//
// The command cmd/sluice-rls is such a server, ready to run; docs/grpc.md
// in the repository shows it behind Envoy. To limit the calls of a Go gRPC
// server itself, see the interceptors of module adapters/grpclimit.
package envoyrls
