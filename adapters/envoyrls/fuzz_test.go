package envoyrls_test

import (
	"context"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// FuzzShouldRateLimit sends calls built from arbitrary text: the service
// answers each with a status per descriptor, or InvalidArgument, and
// never panics.
func FuzzShouldRateLimit(f *testing.F) {
	cfg, err := config.Parse([]byte(conformance), "conf.yaml", config.Env{RateLimitService: true})
	if err != nil {
		f.Fatal(err)
	}
	lim, err := middleware.NewRules(cfg.Rules, cfg.Options()...)
	if err != nil {
		f.Fatal(err)
	}
	defer lim.Close()
	srv, err := envoyrls.NewServer(envoyrls.Options{}, config.NewReloader(lim, cfg, config.Env{RateLimitService: true}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("conf", "client=a;database=users|key_1=value_1,user=bkthomps|key_2=value_2,user=bkthomps", uint32(1), int64(-1))
	f.Add("conf", "message_type=marketing,to_number=1|to_number=1", uint32(0), int64(0))
	f.Add("", "", uint32(5), int64(3))
	f.Add("conf", "remote_address=50.0.0.5,=|ldap=", uint32(1<<31), int64(1<<62))
	f.Fuzz(func(t *testing.T, domain, descs string, hits uint32, own int64) {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		if descs != "" {
			for _, d := range strings.Split(descs, "|") {
				rd := &commonv3.RateLimitDescriptor{}
				for _, e := range strings.Split(d, ",") {
					k, v, _ := strings.Cut(e, "=")
					rd.Entries = append(rd.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
				}
				if own >= 0 {
					rd.HitsAddend = wrapperspb.UInt64(uint64(own))
				}
				req.Descriptors = append(req.Descriptors, rd)
			}
		}
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if domain == "conf" && len(req.Descriptors) > 0 {
				t.Fatalf("valid call: %v", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		over := false
		for _, st := range resp.Statuses {
			over = over || st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if over != (resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("overall %v with statuses %v", resp.OverallCode, resp.Statuses)
		}
	})
}
