package outbound_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/internal/upstreamtest"
	"github.com/sluicehq/sluice/middleware"
)

// serve starts u on a loopback server for the test.
func serve(t *testing.T, u *upstreamtest.Upstream) string {
	t.Helper()
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	u.Start(time.Now())
	return srv.URL
}

// TestLearnFamilies: upstreams that count exactly or in fixed windows,
// 20 requests a second, announcing it in each family of fields, against
// a fleet of two processes configured for 40 (lease mode, 4 requests in
// flight each). Every process learns the quota, from the fields alone,
// and keeps its budget under it; the upstream refuses only while the
// fleet sends what it admitted before the first answers, and while the
// upstream's window still holds that: at most the requests in flight,
// twice.
func TestLearnFamilies(t *testing.T) {
	t.Parallel()
	for _, counting := range []upstreamtest.Counting{upstreamtest.Log, upstreamtest.Fixed} {
		for _, fields := range []upstreamtest.Fields{upstreamtest.Draft10, upstreamtest.GitHub, upstreamtest.OpenAI} {
			t.Run(counting.String()+"-"+fields.String(), func(t *testing.T) {
				t.Parallel()
				up := upstreamtest.New(upstreamtest.Config{Counting: counting, Fields: fields, Limit: upstreamtest.Constant(20)})
				url := serve(t, up)
				rules := []middleware.Rule{{Name: "upstream", Key: outbound.Host(), Limits: []middleware.Limit{middleware.PerSecond(40)}, Sync: middleware.SyncLease, Lease: 4}}
				lims := fleet(t, 2, rules)
				var clients []*http.Client
				for _, lim := range lims {
					clients = append(clients, newClient(t, lim, outbound.Options{MaxWait: 10 * time.Second}))
				}
				const inFlight = 2 * 4
				sent, unsent := hammer(t, clients, 4, 50, url)
				rec := up.Record()
				refused := rec.Refused(0, time.Hour)
				t.Logf("sent %d, refused %d, not sent %d", sent, refused, len(unsent))
				if len(unsent) > 0 {
					t.Errorf("%d requests not sent: %v", len(unsent), unsent[0])
				}
				if refused > 2*inFlight {
					t.Errorf("%d refused, more than twice the %d in flight", refused, inFlight)
				}
				for i, lim := range lims {
					l := lim.Learned()
					if len(l) != 1 || len(l[0].Quotas) != 1 || l[0].Quotas[0].Units != 20 || l[0].Limits[0].Requests > 19 {
						t.Errorf("process %d learned %+v; want the quota of 20, a limit of 19 at most", i, l)
					}
				}
			})
		}
	}
}

// TestLearnFleetwide: an upstream that announces nothing and refuses past
// 20 requests a second (a sliding log, Retry-After: 1), against three
// processes on one Redis configured for 40. The refusals cut the fleet's
// learned fraction, kept in Redis: every process ends with the same cuts,
// at the same instant, and a budget under the configured limit.
func TestLearnFleetwide(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(upstreamtest.Config{Counting: upstreamtest.Log, Fields: upstreamtest.Silent, Limit: upstreamtest.Constant(20)})
	url := serve(t, up)
	var cuts atomic.Int64
	lims := fleet(t, 3, hostRule(middleware.PerSecond(40)), middleware.WithObserver(&middleware.Hooks{
		OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundCut {
				cuts.Add(1)
			}
		}}))
	var clients []*http.Client
	for _, lim := range lims {
		clients = append(clients, newClient(t, lim, outbound.Options{MaxWait: 10 * time.Second}))
	}
	sent, unsent := hammer(t, clients, 3, 100, url)
	t.Logf("sent %d, refused %d, not sent %d, %d cuts reported", sent, up.Record().Refused(0, time.Hour), len(unsent), cuts.Load())
	if cuts.Load() == 0 {
		t.Fatal("no cut: the refusals taught nothing")
	}
	// One more answer each, past the refresh, reads the fleet's fraction.
	time.Sleep(300 * time.Millisecond)
	for _, c := range clients {
		if _, err := get(context.Background(), c, url, "last"); err != nil {
			t.Fatal(err)
		}
	}
	var first middleware.Learned
	for i, lim := range lims {
		l := lim.Learned()
		if len(l) != 1 {
			t.Fatalf("process %d learned %+v", i, l)
		}
		if i == 0 {
			first = l[0]
		}
		if l[0].Cuts != cuts.Load() || l[0].Cuts != first.Cuts || l[0].CutAt.Sub(first.CutAt).Abs() > 50*time.Millisecond || l[0].Limits[0].Requests >= 40 {
			t.Errorf("process %d: %d cuts at %s, limit %d; want the fleet's %d cuts at %s (%d reported), under 40",
				i, l[0].Cuts, l[0].CutAt, l[0].Limits[0].Requests, first.Cuts, first.CutAt, cuts.Load())
		}
	}
}

// TestHostileQuota: quotas above the configured limit, or that cannot be
// read, never raise the budget: the limits in force stay the configured
// ones.
func TestHostileQuota(t *testing.T) {
	t.Parallel()
	for _, h := range []map[string]string{
		{"RateLimit-Policy": `"a";q=1000000;w=1`, "RateLimit": `"a";r=999999;t=1`},
		{"X-RateLimit-Limit": "1000000000000000000000", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "1"},
		{"x-ratelimit-limit-requests": "-20", "x-ratelimit-remaining-requests": "95", "x-ratelimit-reset-requests": "1s"},
		{"RateLimit-Policy": `"a";q=0;w=1`, "RateLimit": `"a";r=99;t=0`},
		{"RateLimit-Policy": `"a";q=1e9;w=1`},
		{"RateLimit-Policy": `"a";q=200;w=-1`},
	} {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
			for k, v := range h {
				w.Header().Set(k, v)
			}
		})
		lim := newLimiter(t, hostRule(middleware.PerSecond(100)))
		c := newClient(t, lim, outbound.Options{MaxWait: 2 * time.Second})
		for i := range 3 {
			if _, err := get(context.Background(), c, up.URL, strconv.Itoa(i)); err != nil {
				t.Fatal(err)
			}
		}
		for _, l := range lim.Learned() {
			if l.Limits[0].Requests != 100 {
				t.Errorf("fields %v: learned %+v; want the configured 100", h, l)
			}
		}
		st, err := lim.Peek(context.Background(), "upstream", "host:"+up.Listener.Addr().String())
		if err != nil || st[0].Limit.Requests != 100 {
			t.Errorf("fields %v: in force %+v, %v; want the configured 100", h, st, err)
		}
	}
}

// TestLearnTokens: an LLM provider's limits of requests and tokens (30
// requests and 1,000 tokens a second, OpenAI's fields) against a fleet
// configured for 100 and 4,000, each request using 100 tokens, reserved
// with WithCost and settled from the provider's usage field (the rule's
// Usage.Header). Both budgets learn the provider's quotas.
func TestLearnTokens(t *testing.T) {
	t.Parallel()
	up := upstreamtest.New(upstreamtest.Config{Counting: upstreamtest.Fixed, Fields: upstreamtest.OpenAI,
		Limit: upstreamtest.Constant(30), Tokens: upstreamtest.Constant(1000)})
	url := serve(t, up)
	rules := []middleware.Rule{{Name: "llm", Key: outbound.Host(), Limits: []middleware.Limit{middleware.PerSecond(100)},
		Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerSecond(4000)}, EstimateFunc: outbound.Cost, Max: 200,
			Header: upstreamtest.UsageHeader}}}
	lims := fleet(t, 2, rules)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, lim := range lims {
		c := newClient(t, lim, outbound.Options{MaxWait: 5 * time.Second})
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 8 {
					req, _ := http.NewRequestWithContext(outbound.WithCost(context.Background(), 100), "POST", url, nil)
					req.Header.Set(upstreamtest.TokensHeader, "100")
					resp, err := c.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					resp.Body.Close()
				}
			}()
		}
	}
	wg.Wait()
	rec := up.Record()
	t.Logf("admitted %d, refused %d, not sent %d", rec.Admitted(0, time.Hour), rec.Refused(0, time.Hour), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d requests not sent", failed.Load())
	}
	for i, lim := range lims {
		var tokens, requests *middleware.Learned
		l := lim.Learned()
		for j := range l {
			switch l[j].Unit {
			case "tokens":
				tokens = &l[j]
			case "requests":
				requests = &l[j]
			}
		}
		if tokens == nil || len(tokens.Quotas) != 1 || tokens.Quotas[0].Units != 1000 || tokens.Limits[0].Requests > 999 || tokens.Configured[0].Requests != 4000 {
			t.Errorf("process %d: tokens learned %+v; want the quota of 1,000", i, tokens)
		}
		if requests == nil || len(requests.Quotas) != 1 || requests.Quotas[0].Units != 30 || requests.Limits[0].Requests > 29 {
			t.Errorf("process %d: requests learned %+v; want the quota of 30", i, requests)
		}
	}
	// 6 requests in flight; 10 spend a second's tokens.
	if r := rec.Refused(0, time.Hour); r > 2*6 {
		t.Errorf("%d refused, more than twice the 6 in flight", r)
	}
}

// TestLearningOff: Options.NoLearning learns nothing; Options.Margin sets
// the units kept below a quota (negative: none).
func TestLearningOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		o    outbound.Options
		want int // the limit in force after an answer announcing 50 a second; 0: nothing learned
	}{
		{outbound.Options{NoLearning: true}, 0},
		{outbound.Options{IgnoreUpstream: true}, 0},
		{outbound.Options{Margin: -1}, 50},
		{outbound.Options{Margin: 5}, 45},
		{outbound.Options{}, 49},
	} {
		up := upstreamtest.New(upstreamtest.Config{Counting: upstreamtest.Fixed, Fields: upstreamtest.Draft10, Limit: upstreamtest.Constant(50)})
		url := serve(t, up)
		lim := newLimiter(t, hostRule(middleware.PerSecond(100)))
		c := newClient(t, lim, tc.o)
		if _, err := get(context.Background(), c, url, "1"); err != nil {
			t.Fatal(err)
		}
		l := lim.Learned()
		switch {
		case tc.want == 0 && len(l) != 0:
			t.Errorf("%+v: learned %+v, want nothing", tc.o, l)
		case tc.want != 0 && (len(l) != 1 || l[0].Limits[0].Requests != tc.want):
			t.Errorf("%+v: learned %+v, want %d", tc.o, l, tc.want)
		}
	}
}
