package envoyrls_test

import (
	"context"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// BenchmarkShouldRateLimit measures the service's own cost per call,
// without gRPC: one descriptor and three, on 10,000 clients in memory.
func BenchmarkShouldRateLimit(b *testing.B) {
	const doc = `domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100000000}
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 100000000}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: minute, requests_per_unit: 100000000}
`
	cfg, err := config.Parse([]byte(doc), "bench.yaml", config.Env{RateLimitService: true})
	if err != nil {
		b.Fatal(err)
	}
	lim, err := middleware.NewRules(cfg.Rules, cfg.Options()...)
	if err != nil {
		b.Fatal(err)
	}
	defer lim.Close()
	srv, err := envoyrls.NewServer(envoyrls.Options{}, config.NewReloader(lim, cfg, config.Env{RateLimitService: true}))
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([][2]*rlsv3.RateLimitRequest, 10000)
	for i := range reqs {
		v := "c" + strconv.Itoa(i)
		one := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: v}}}}
		three := append(one[:1:1],
			&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "database", Value: "users"}}},
			&commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: v}}})
		reqs[i] = [2]*rlsv3.RateLimitRequest{{Domain: "bench", Descriptors: one}, {Domain: "bench", Descriptors: three}}
	}
	for j, name := range []string{"descriptors=1", "descriptors=3"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					resp, err := srv.ShouldRateLimit(context.Background(), reqs[i%len(reqs)][j])
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Fatal(resp, err)
					}
					i++
				}
			})
		})
	}
}
