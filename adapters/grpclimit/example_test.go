package grpclimit_test

import (
	"context"
	"log"
	"strings"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/adapters/grpclimit"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// Example limits every client of a gRPC server to 50 calls a second, one
// method further by API key, and uploads to two at a time per client;
// health checks are never limited.
func Example() {
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "per-client", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerSecond(50)}},
		{Name: "search", Path: "/shop.Catalog/Search", Key: keyfunc.Header("x-api-key"),
			Limits: []middleware.Limit{middleware.PerMinute(100)}},
		{Name: "uploads", Path: "/shop.Catalog/Upload", Key: keyfunc.RemoteIP(), Concurrency: 2},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	o := grpclimit.Options{Skip: func(_ context.Context, method string) bool {
		return strings.HasPrefix(method, "/grpc.health.v1.")
	}}
	s := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, o)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, o)),
	)
	defer s.Stop()
	// Register the services on s, then s.Serve(listener).
}
