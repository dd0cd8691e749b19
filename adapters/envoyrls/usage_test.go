package envoyrls_test

import (
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/adapters/envoyrls"
)

// usageFile is a budget of LLM tokens per API key, checked when a request
// starts and charged when its stream ends, as Envoy's AI gateway does.
const usageFile = `
domain: llm
descriptors:
  - key: api_key
    usage: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

// TestUsage plays Envoy's pattern for a cost known after the response: a
// check at request start (hits_addend 0), then a charge at stream end
// whose hits_addend is the tokens used. The charge is applied even when it
// takes the counter past its limit, and its answer refuses nothing; the
// checks then say OVER_LIMIT until the debt is waited off.
func TestUsage(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			r := startRLS(t, b.store(t), envoyrls.Options{Timeout: time.Second}, nil, usageFile)
			m := rlsv3.RateLimitResponse_RateLimit_MINUTE
			steps := []struct {
				what string
				d    string // the descriptor's hits_addend
				want want
			}{
				{"check at start", "+0", want{ok, 1000, m, "", 1000, 0}},
				{"charge 600 at end", "+600", want{ok, 1000, m, "", 400, 50 * time.Second}},
				{"check at start", "+0", want{ok, 1000, m, "", 400, 50 * time.Second}},
				// 900 more: 500 past the limit, applied all the same.
				{"charge 900 at end, past the limit", "+900", want{ok, 1000, m, "", 0, 50 * time.Second}},
				{"check in debt", "+0", want{over, 1000, m, "", 0, 50 * time.Second}},
				// A stream that was admitted before the debt still charges.
				{"charge 50 in debt", "+50", want{ok, 1000, m, "", 0, 50 * time.Second}},
			}
			for _, s := range steps {
				resp := r.call(t, "llm", 0, desc("api_key=k1", s.d))
				s.want.check(t, s.what, resp.Statuses[0])
				if resp.OverallCode != s.want.code {
					t.Errorf("%s: overall %v", s.what, resp.OverallCode)
				}
			}
			// The fixed window renews, debt included, 50 s on.
			r.clock.Add(50 * time.Second)
			want{ok, 1000, m, "", 1000, 0}.check(t, "check next window", r.call(t, "llm", 0, desc("api_key=k1", "+0")).Statuses[0])
			want{ok, 1000, m, "", 1000, 0}.check(t, "another key", r.call(t, "llm", 0, desc("api_key=k2", "+0")).Statuses[0])
		})
	}
}
