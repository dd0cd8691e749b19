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
// The command cmd/sluice-rls is such a server, ready to run; docs/grpc.md
// in the repository shows it behind Envoy. To limit the calls of a Go gRPC
// server itself, see the interceptors of module adapters/grpclimit.
package envoyrls
