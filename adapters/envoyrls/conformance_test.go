package envoyrls_test

import (
	"context"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/schedlag"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// conformance is the configuration of the conformance tests: the Envoy
// ratelimit README's examples 2, 3, 5, 6 and 7, and a limit of 20 a
// minute.
const conformance = `
domain: conf
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: user
        value: user-b
        rate_limit: {unit: second, requests_per_unit: 20}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, unit: second, requests_per_unit: 5}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          unit: second
          requests_per_unit: 10
`

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// want is what one descriptor status should say.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	limit     uint32 // requests_per_unit, with unit; 0 and no unit: no current_limit
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	name      string // current_limit's name, when checked
	remaining uint32
	reset     time.Duration // duration_until_reset, when not 0
}

func (w want) check(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus) {
	t.Helper()
	if st.GetCode() != w.code {
		t.Errorf("%s: code %v, want %v", what, st.GetCode(), w.code)
	}
	cl := st.GetCurrentLimit()
	switch {
	case w.unit == 0 && cl != nil:
		t.Errorf("%s: current_limit %v, want none", what, cl)
	case w.unit != 0 && cl == nil:
		t.Errorf("%s: no current_limit, want %d per %v", what, w.limit, w.unit)
	case w.unit != 0 && (cl.GetRequestsPerUnit() != w.limit || cl.GetUnit() != w.unit):
		t.Errorf("%s: current_limit %d per %v, want %d per %v", what, cl.GetRequestsPerUnit(), cl.GetUnit(), w.limit, w.unit)
	case w.name != "" && cl.GetName() != w.name:
		t.Errorf("%s: current_limit name %q, want %q", what, cl.GetName(), w.name)
	}
	if st.GetLimitRemaining() != w.remaining {
		t.Errorf("%s: limit_remaining %d, want %d", what, st.GetLimitRemaining(), w.remaining)
	}
	if w.reset != 0 && st.GetDurationUntilReset().AsDuration() != w.reset {
		t.Errorf("%s: duration_until_reset %v, want %v", what, st.GetDurationUntilReset().AsDuration(), w.reset)
	}
}

// TestConformance runs the Envoy ratelimit service's documented behaviour
// against a real gRPC server on loopback, on each store.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range conformanceCases {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					r := startRLS(t, b.store(t), envoyrls.Options{Timeout: time.Second}, nil, conformance)
					tc.run(t, r)
				})
			}
		})
	}
}

var conformanceCases = []struct {
	name string
	run  func(t *testing.T, r *rls)
}{
	{"twenty per minute", func(t *testing.T, r *rls) {
		for i := range 20 {
			resp := r.call(t, "conf", 0, desc("client=a"))
			if resp.OverallCode != ok {
				t.Fatalf("call %d: %v", i+1, resp.OverallCode)
			}
			want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "conf.client", uint32(19 - i), 50 * time.Second}.check(t, "call "+itoa(i+1), resp.Statuses[0])
		}
		for i := 21; i <= 23; i++ {
			resp := r.call(t, "conf", 0, desc("client=a"))
			if resp.OverallCode != over {
				t.Fatalf("call %d: %v, want OVER_LIMIT", i, resp.OverallCode)
			}
			want{over, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "conf.client", 0, 50 * time.Second}.check(t, "call "+itoa(i), resp.Statuses[0])
		}
		// Another client has its own count; the next window starts afresh.
		want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 19, 0}.check(t, "client b", r.call(t, "conf", 0, desc("client=b")).Statuses[0])
		r.clock.Add(50 * time.Second)
		want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 19, time.Minute}.check(t, "next window", r.call(t, "conf", 0, desc("client=a")).Statuses[0])
	}},
	{"two descriptors", func(t *testing.T, r *rls) {
		for i := range 5 {
			resp := r.call(t, "conf", 0, desc("client=c"), desc("database=users"))
			if resp.OverallCode != ok || len(resp.Statuses) != 2 {
				t.Fatalf("call %d: %v, %d statuses", i+1, resp.OverallCode, len(resp.Statuses))
			}
			want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", uint32(19 - i), 0}.check(t, "client", resp.Statuses[0])
			want{ok, 5, rlsv3.RateLimitResponse_RateLimit_SECOND, "conf.database_users", uint32(4 - i), time.Second}.check(t, "database", resp.Statuses[1])
		}
		resp := r.call(t, "conf", 0, desc("client=c"), desc("database=users"))
		if resp.OverallCode != over {
			t.Fatalf("call 6: %v, want OVER_LIMIT", resp.OverallCode)
		}
		// Each descriptor is counted on its own, as Envoy's service does.
		want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 14, 0}.check(t, "client", resp.Statuses[0])
		want{over, 5, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 0}.check(t, "database", resp.Statuses[1])
		// A descriptor no rule matches is OK without a limit.
		resp = r.call(t, "conf", 0, desc("database=orders"), desc("nothing=here"))
		if resp.OverallCode != ok {
			t.Fatalf("unmatched: %v", resp.OverallCode)
		}
		want{code: ok}.check(t, "database=orders", resp.Statuses[0])
		want{code: ok}.check(t, "nothing=here", resp.Statuses[1])
	}},
	{"nested", func(t *testing.T, r *rls) {
		for i := range 6 {
			resp := r.call(t, "conf", 0, desc("message_type=marketing", "to_number=2061111111"), desc("to_number=2061111111"))
			code := ok
			if i == 5 {
				code = over
			}
			if resp.OverallCode != code {
				t.Fatalf("call %d: %v, want %v", i+1, resp.OverallCode, code)
			}
			want{code, 5, rlsv3.RateLimitResponse_RateLimit_DAY, "conf.message_type_marketing.to_number", uint32(max(4-i, 0)), 0}.check(t, "marketing "+itoa(i+1), resp.Statuses[0])
			want{ok, 100, rlsv3.RateLimitResponse_RateLimit_DAY, "conf.to_number", uint32(99 - i), 0}.check(t, "number "+itoa(i+1), resp.Statuses[1])
		}
		// Another number of the marketing type has its own count; another
		// type matches no nested rule, nor the one level rule (it is two
		// levels deep).
		want{ok, 5, rlsv3.RateLimitResponse_RateLimit_DAY, "", 4, 0}.check(t, "other number",
			r.call(t, "conf", 0, desc("message_type=marketing", "to_number=2062222222")).Statuses[0])
		want{code: ok}.check(t, "other type", r.call(t, "conf", 0, desc("message_type=transactional", "to_number=2061111111")).Statuses[0])
	}},
	{"shadow", func(t *testing.T, r *rls) {
		for i := range 12 {
			resp := r.call(t, "conf", 0, desc("service=auth", "user=user-a"))
			if resp.OverallCode != ok {
				t.Fatalf("shadow call %d: %v", i+1, resp.OverallCode)
			}
			st := resp.Statuses[0]
			if st.Code != ok || st.CurrentLimit.GetRequestsPerUnit() != 10 {
				t.Fatalf("shadow call %d: %v", i+1, st)
			}
		}
		for i := range 21 {
			resp := r.call(t, "conf", 0, desc("service=auth", "user=user-b"))
			if code := resp.OverallCode; (i < 20) != (code == ok) {
				t.Fatalf("user-b call %d: %v", i+1, code)
			}
		}
	}},
	{"unlimited", func(t *testing.T, r *rls) {
		for i := range 3 {
			resp := r.call(t, "conf", 50, desc("ldap=x"))
			if resp.OverallCode != ok {
				t.Fatalf("call %d: %v", i+1, resp.OverallCode)
			}
			want{code: ok, remaining: math.MaxUint32}.check(t, "ldap", resp.Statuses[0])
		}
	}},
	{"blocked", func(t *testing.T, r *rls) {
		resp := r.call(t, "conf", 0, desc("remote_address=50.0.0.5"))
		if resp.OverallCode != over {
			t.Fatalf("blocked: %v", resp.OverallCode)
		}
		want{over, 0, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 0}.check(t, "blocked", resp.Statuses[0])
		want{code: ok}.check(t, "other address", r.call(t, "conf", 0, desc("remote_address=50.0.0.6")).Statuses[0])
	}},
	{"hits_addend", func(t *testing.T, r *rls) {
		m := rlsv3.RateLimitResponse_RateLimit_MINUTE
		steps := []struct {
			what string
			hits uint32
			d    *commonv3.RateLimitDescriptor
			want want
		}{
			{"request 5", 5, desc("client=h"), want{ok, 20, m, "", 15, 0}},
			{"descriptor 2 over request 5", 5, desc("client=h", "+2"), want{ok, 20, m, "", 13, 0}},
			{"descriptor 0 checks", 7, desc("client=h", "+0"), want{ok, 20, m, "", 13, 50 * time.Second}},
			{"request 14 does not fit", 14, desc("client=h"), want{over, 20, m, "", 13, 0}},
			{"request 13 fits", 13, desc("client=h"), want{ok, 20, m, "", 0, 0}},
			{"check at 0 remaining", 0, desc("client=h", "+0"), want{over, 20, m, "", 0, 0}},
			{"request 0 counts 1", 0, desc("client=h"), want{over, 20, m, "", 0, 0}},
			{"check another client", 0, desc("client=i", "+0"), want{ok, 20, m, "", 20, 0}},
			{"check the shadow rule", 0, desc("service=s", "user=user-a", "+0"), want{ok, 10, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 10, 0}},
			{"check the blocked address", 0, desc("remote_address=50.0.0.5", "+0"), want{over, 0, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 0}},
			{"check unlimited", 0, desc("ldap=x", "+0"), want{code: ok, remaining: math.MaxUint32}},
		}
		for _, s := range steps {
			s.want.check(t, s.what, r.call(t, "conf", s.hits, s.d).Statuses[0])
		}
	}},
	{"replaces", func(t *testing.T, r *rls) {
		// Alone, (key_1, user) has its 5 a second.
		want{ok, 5, rlsv3.RateLimitResponse_RateLimit_SECOND, "specific_limit", 4, 0}.check(t, "alone",
			r.call(t, "conf", 0, desc("key_1=value_1", "user=bkthomps")).Statuses[0])
		// With (key_2, user) in the same call, it is replaced: not counted,
		// and the replacing limit applies.
		for i := range 8 {
			resp := r.call(t, "conf", 0, desc("key_1=value_1", "user=bkthomps"), desc("key_2=value_2", "user=bkthomps"))
			if resp.OverallCode != ok {
				t.Fatalf("call %d: %v", i+1, resp.OverallCode)
			}
			want{code: ok}.check(t, "replaced", resp.Statuses[0])
			want{ok, 10, rlsv3.RateLimitResponse_RateLimit_SECOND, "", uint32(9 - i), 0}.check(t, "replacing", resp.Statuses[1])
		}
		want{ok, 5, rlsv3.RateLimitResponse_RateLimit_SECOND, "specific_limit", 3, 0}.check(t, "alone again",
			r.call(t, "conf", 0, desc("key_1=value_1", "user=bkthomps")).Statuses[0])
	}},
	{"headers", func(t *testing.T, r *rls) {
		var resp *rlsv3.RateLimitResponse
		for range 3 {
			resp = r.call(t, "conf", 0, desc("client=hd"), desc("database=users"), desc("ldap=x"))
		}
		// The database's 5 a second is closest to its limit.
		got := headerMap(resp)
		wantHeaders(t, "closest", got, map[string]string{
			"RateLimit":        `"conf.database_users";r=2;t=1`,
			"RateLimit-Policy": `"conf.client";q=20;w=60, "conf.database_users";q=5;w=1`,
		})
		for range 3 {
			resp = r.call(t, "conf", 0, desc("client=hd"), desc("database=users"))
		}
		wantHeaders(t, "over", headerMap(resp), map[string]string{
			"RateLimit":        `"conf.database_users";r=0;t=1`,
			"RateLimit-Policy": `"conf.client";q=20;w=60, "conf.database_users";q=5;w=1`,
			"Retry-After":      "1",
		})
		if h := headerMap(r.call(t, "conf", 0, desc("ldap=x"))); len(h) != 0 {
			t.Errorf("unlimited only: headers %v, want none", h)
		}
	}},
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

func wantHeaders(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: headers %v, want %v", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", what, k, got[k], v)
		}
	}
}

// TestHeadersBoth checks that a file with headers: both adds the
// X-RateLimit-* fields.
func TestHeadersBoth(t *testing.T) {
	t.Parallel()
	r := startRLS(t, backends[0].store(t), envoyrls.Options{}, nil,
		"headers: both\ndomain: hb\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 20}\n")
	wantHeaders(t, "both", headerMap(r.call(t, "hb", 0, desc("client=x"))), map[string]string{
		"RateLimit":             `"hb.client";r=19;t=50`,
		"RateLimit-Policy":      `"hb.client";q=20;w=60`,
		"X-RateLimit-Limit":     "20",
		"X-RateLimit-Remaining": "19",
		"X-RateLimit-Reset":     "50",
	})
}

// TestInvalidArgument checks the answers to calls that cannot be decided,
// and that each domain is served from its own file.
func TestInvalidArgument(t *testing.T) {
	t.Parallel()
	r := startRLS(t, backends[0].store(t), envoyrls.Options{}, nil, conformance,
		"domain: other\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	tests := []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{desc("client=a")}}, "rate limit domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "conf"}, `rate limit descriptor list must not be empty (domain "conf")`},
		{&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{desc("client=a")}}, `unknown rate limit domain "nope" (this service serves "conf", "other")`},
	}
	for _, tt := range tests {
		_, err := r.client.ShouldRateLimit(context.Background(), tt.req)
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != tt.want {
			t.Errorf("%v: got %v %q, want InvalidArgument %q", tt.req, st.Code(), st.Message(), tt.want)
		}
	}
	want{ok, 1, rlsv3.RateLimitResponse_RateLimit_SECOND, "other.client", 0, 0}.check(t, "other", r.call(t, "other", 0, desc("client=a")).Statuses[0])
	want{over, 1, rlsv3.RateLimitResponse_RateLimit_SECOND, "", 0, 0}.check(t, "other", r.call(t, "other", 0, desc("client=a")).Statuses[0])
	want{ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 19, 0}.check(t, "conf", r.call(t, "conf", 0, desc("client=a")).Statuses[0])
}

// TestReloadUnderTraffic changes a limit while calls flow: no call fails,
// every call is decided under the old limit or the new one, the count
// carries on across the reload, and the new limit is in force after it.
func TestReloadUnderTraffic(t *testing.T) {
	t.Parallel()
	for _, b := range backends[:2] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			doc := "domain: rl\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n"
			r := startRLS(t, b.store(t), envoyrls.Options{Timeout: time.Second}, nil, doc)
			const workers, calls = 4, 25
			var wg sync.WaitGroup
			errs := make(chan error, workers*calls)
			limits := make(chan uint32, workers*calls)
			start := make(chan struct{})
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range calls {
						resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
							Domain: "rl", Descriptors: []*commonv3.RateLimitDescriptor{desc("client=a")}})
						if err != nil {
							errs <- err
							continue
						}
						if resp.OverallCode != ok {
							errs <- status.Errorf(codes.Unknown, "over limit at %d remaining", resp.Statuses[0].LimitRemaining)
						}
						limits <- resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
					}
				}()
			}
			close(start)
			for len(limits) < 10 { // some calls decided under the old limit first
				runtime.Gosched()
			}
			if err := os.WriteFile(r.paths[0], []byte(strings.Replace(doc, "1000", "150", 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := r.reloaders[0].Reload(); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			close(limits)
			for err := range errs {
				t.Error(err)
			}
			seen := map[uint32]int{}
			for l := range limits {
				seen[l]++
			}
			if len(seen) > 2 || seen[1000]+seen[150] != workers*calls {
				t.Errorf("limits seen %v, want only 1000 and 150", seen)
			}
			// The 100 calls were counted, under either limit.
			want{ok, 150, rlsv3.RateLimitResponse_RateLimit_MINUTE, "", 150 - workers*calls - 1, 0}.check(t, "after", r.call(t, "rl", 0, desc("client=a")).Statuses[0])
		})
	}
}

// TestRedisStopped stops, then hangs, the Redis server under the service
// and checks that each call is answered by the failure policy, promptly:
// fail open answers OK without a limit (and the observer counts it), fail
// closed answers Unavailable.
func TestRedisStopped(t *testing.T) {
	t.Parallel()
	for _, policy := range []middleware.FailurePolicy{middleware.FailOpen, middleware.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			srv := redistest.Standalone(t)
			// The store would wait 2 s for a hung server, and never takes
			// it as down for being slow: a call that returns well before
			// that was bounded by the service's 10 ms.
			store := redisStore(t, srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: 2 * time.Second, StallThreshold: -1})
			obs := &outcomes{}
			r := startRLS(t, store, envoyrls.Options{}, []middleware.Option{middleware.WithFailurePolicy(policy), middleware.WithObserver(obs)}, conformance)
			// The first calls connect and load the script, which may take
			// longer than the 10 ms a call is given on a busy machine.
			for i := 0; ; i++ {
				resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain: "conf", Descriptors: []*commonv3.RateLimitDescriptor{desc("client=warm")}})
				if err == nil && resp.Statuses[0].CurrentLimit != nil {
					break
				}
				if i == 50 {
					t.Fatalf("Redis up: no decision in 50 calls: %v, %v", resp, err)
				}
			}
			lags := schedlag.Start(t)
			for _, phase := range []string{"stopped", "hung"} {
				if phase == "stopped" {
					srv.Kill()
				} else {
					if err := srv.Restart(); err != nil {
						t.Fatal(err)
					}
					if err := srv.Pause(); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = srv.Resume() })
				}
				before := obs.failedOpen.Load()
				var tooks []time.Duration
				for i := range 5 {
					begin := time.Now()
					resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
						Domain: "conf", Descriptors: []*commonv3.RateLimitDescriptor{desc("client=a"), desc("database=users"), desc("client=b", "+0")}})
					took := time.Since(begin) - lags.Worst(begin, time.Now())
					tooks = append(tooks, took)
					if took > 100*time.Millisecond { // a hang would last the store's 2 s
						t.Errorf("%s call %d took %v beyond the scheduling lag it met: want it bounded by the 10ms timeout", phase, i+1, took)
					}
					switch policy {
					case middleware.FailOpen:
						if err != nil || resp.OverallCode != ok {
							t.Fatalf("%s call %d: %v, %v; want OK", phase, i+1, resp.GetOverallCode(), err)
						}
						for j, st := range resp.Statuses {
							want{code: ok}.check(t, phase+" descriptor "+itoa(j), st)
						}
					case middleware.FailClosed:
						if st, _ := status.FromError(err); st.Code() != codes.Unavailable {
							t.Fatalf("%s call %d: %v, want Unavailable", phase, i+1, err)
						}
					}
				}
				slices.Sort(tooks)
				t.Logf("%s: calls took %v beyond the scheduling lag they met", phase, tooks)
				if tooks[2] > 20*time.Millisecond {
					t.Errorf("%s: the median call took %v beyond the scheduling lag: want inside Envoy's 20 ms", phase, tooks[2])
				}
				if got := obs.failedOpen.Load() - before; policy == middleware.FailOpen && got != 10 {
					t.Errorf("%s: observer counted %d calls failed open, want 10 (2 counted descriptors x 5)", phase, got)
				}
			}
		})
	}
}

// TestHeadersOverrideWindow checks that RateLimit-Policy gives the window
// of the limit that counted, here a client's override of 90 s, not one
// read back from the descriptor file's unit.
func TestHeadersOverrideWindow(t *testing.T) {
	t.Parallel()
	r := startRLS(t, backends[0].store(t), envoyrls.Options{}, nil,
		"domain: ow\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 20}\n")
	lim := r.reloaders[0].Limiter()
	descs := []config.Descriptor{{Entries: []config.DescriptorEntry{{Key: "client", Value: "x"}}, Cost: 1}}
	req := config.NewDescriptorRequest(context.Background(), descs, 0)
	rules := lim.Rules()
	var rule *middleware.Rule
	for i := range rules {
		if rules[i].Match != nil && rules[i].Match(req) {
			rule = &rules[i]
		}
	}
	if rule == nil {
		t.Fatal("no rule matches client=x")
	}
	key, err := rule.Key(req)
	if err != nil {
		t.Fatal(err)
	}
	o := middleware.Override{Rule: rule.Name, Key: key, Limits: []middleware.Limit{{Requests: 7, Window: 90 * time.Second, Algorithm: middleware.FixedWindow}}}
	if err := lim.SetOverride(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	got := headerMap(r.call(t, "ow", 0, desc("client=x")))
	if want := `"ow.client";q=7;w=90`; got["RateLimit-Policy"] != want {
		t.Errorf("RateLimit-Policy %q, want %q", got["RateLimit-Policy"], want)
	}
}
