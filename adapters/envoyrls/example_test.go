package envoyrls_test

import (
	"context"
	"fmt"
	"log"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// ExampleNewServer serves a descriptor file as Envoy's rate limit service
// and decides a call directly; a real server registers it on a
// grpc.Server with Register.
func ExampleNewServer() {
	const doc = `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 2}
`
	env := config.Env{RateLimitService: true}
	cfg, err := config.Parse([]byte(doc), "ratelimit.yaml", env)
	if err != nil {
		log.Fatal(err)
	}
	lim, err := middleware.NewRules(cfg.Rules, cfg.Options()...)
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	srv, err := envoyrls.NewServer(envoyrls.Options{}, config.NewReloader(lim, cfg, env))
	if err != nil {
		log.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "messaging", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}},
	}}}
	for range 3 {
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			log.Fatal(err)
		}
		st := resp.Statuses[0]
		fmt.Println(resp.OverallCode, st.CurrentLimit.RequestsPerUnit, st.CurrentLimit.Unit, st.LimitRemaining)
	}
	// Output:
	// OK 2 DAY 1
	// OK 2 DAY 0
	// OVER_LIMIT 2 DAY 0
}
