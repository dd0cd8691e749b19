// Package envoyrls serves sluice's limiter as Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService), and rate-limits Go gRPC
// servers with interceptors.
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
// The command cmd/sluice-rls is such a server, ready to run. The
// interceptors (UnaryServerInterceptor, StreamServerInterceptor) limit
// the calls of a Go gRPC server with a middleware.Limiter and its rules.
// docs/grpc.md in the repository shows both at work.
package envoyrls
