package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// topRules: every request counts under site; /api has 3 a minute per
// address on top; /quiet tracks only rates.
func topRules() []middleware.Rule {
	return []middleware.Rule{
		{Name: "site", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1000)}},
		{Name: "api", Path: "/api", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(3)}, TopClients: 10},
		{Name: "quiet", Path: "/quiet", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(3)}, TopClients: -1},
	}
}

// clientsOf renders a list's clients as "key=count±error".
func clientsOf(l middleware.TopList) string {
	s := ""
	for i, c := range l.Clients {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s=%d±%d", c.Key, c.Count, c.Error)
	}
	return s
}

// TestTopClients: the clients a rule denied and charged most, per rule
// and period, exact while there are fewer clients than counters; a
// denied request is charged to no rule; the minute forgets, the hour
// remembers.
func TestTopClients(t *testing.T) {
	t.Parallel()
	clk := testclock.New(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	lim, err := middleware.NewRules(topRules(), middleware.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok200)
	const a, b, c = "192.0.2.1:1", "192.0.2.2:1", "192.0.2.3:1"
	for range 10 {
		doFrom(h, a, "/api") // 3 allowed, 7 denied
	}
	for range 2 {
		doFrom(h, b, "/api")
	}
	for range 5 {
		doFrom(h, c, "/")
	}
	doFrom(h, c, "/quiet")
	ctx := context.Background()
	for _, tc := range []struct {
		rule   string
		by     middleware.TopBy
		period middleware.TopPeriod
		want   string
		total  uint64
	}{
		{"api", middleware.TopDenied, middleware.TopMinute, "ip:192.0.2.1=7±0", 7},
		{"api", middleware.TopCharged, middleware.TopMinute, "ip:192.0.2.1=3±0 ip:192.0.2.2=2±0", 5},
		{"site", middleware.TopCharged, middleware.TopHour, "ip:192.0.2.3=6±0 ip:192.0.2.1=3±0 ip:192.0.2.2=2±0", 11},
		{"site", middleware.TopDenied, middleware.TopMinute, "", 0},
	} {
		l, err := lim.TopClients(ctx, tc.rule, tc.by, tc.period, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := clientsOf(l); got != tc.want || l.Total != tc.total || l.ErrorBound != 0 || l.Servers != 1 || l.FleetErr != nil {
			t.Errorf("%s by %s over %s: %q, total %d, bound %d, servers %d; want %q, total %d",
				tc.rule, tc.by, tc.period, got, l.Total, l.ErrorBound, l.Servers, tc.want, tc.total)
		}
		for _, cl := range l.Clients {
			if !cl.FirstSeen.Equal(clk.Now()) {
				t.Errorf("%s: first seen %v, want %v", cl.Key, cl.FirstSeen, clk.Now())
			}
		}
	}
	if l, _ := lim.TopClients(ctx, "site", middleware.TopCharged, middleware.TopHour, 1); clientsOf(l) != "ip:192.0.2.3=6±0" {
		t.Errorf("limit 1: %q", clientsOf(l))
	}
	if l, _ := lim.TopClients(ctx, "api", middleware.TopCharged, middleware.TopMinute, 0); l.K != 10 {
		t.Errorf("K of api %d, want its TopClients 10", l.K)
	}
	if _, err := lim.TopClients(ctx, "quiet", middleware.TopDenied, middleware.TopMinute, 0); err == nil {
		t.Error("a rule with TopClients -1 has a list")
	}
	if _, err := lim.TopClients(ctx, "nope", middleware.TopDenied, middleware.TopMinute, 0); !errors.Is(err, middleware.ErrUnknownRule) {
		t.Errorf("unknown rule: %v", err)
	}

	rates, err := lim.Rates()
	if err != nil || len(rates) != 3 {
		t.Fatalf("rates: %d rules, %v", len(rates), err)
	}
	for _, rr := range rates {
		last := rr.Points[len(rr.Points)-1]
		want := map[string][2]uint64{"site": {11, 0}, "api": {5, 7}, "quiet": {1, 0}}[rr.Rule]
		if len(rr.Points) != 90 || rr.Interval != 10*time.Second || last.Allowed != want[0] || last.Denied != want[1] {
			t.Errorf("%s: %d points of %s, last %+v; want 90 of 10s, allowed %d denied %d", rr.Rule, len(rr.Points), rr.Interval, last, want[0], want[1])
		}
	}

	clk.Add(2 * time.Minute)
	if l, _ := lim.TopClients(ctx, "api", middleware.TopDenied, middleware.TopMinute, 0); len(l.Clients) != 0 {
		t.Errorf("minute two minutes later: %q", clientsOf(l))
	}
	if l, _ := lim.TopClients(ctx, "api", middleware.TopDenied, middleware.TopHour, 0); clientsOf(l) != "ip:192.0.2.1=7±0" {
		t.Errorf("hour two minutes later: %q", clientsOf(l))
	}

	off, err := middleware.NewRules(topRules(), middleware.WithTopClients(middleware.TopConfig{Off: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if _, err := off.TopClients(ctx, "api", middleware.TopDenied, middleware.TopMinute, 0); !errors.Is(err, middleware.ErrTopOff) {
		t.Errorf("tracking off: %v", err)
	}
	if _, err := off.Rates(); !errors.Is(err, middleware.ErrTopOff) {
		t.Errorf("rates with tracking off: %v", err)
	}
}

// TestTopClientsCost: a rule's cost is what its clients are charged, and
// a denied request's cost what it is denied.
func TestTopClientsCost(t *testing.T) {
	t.Parallel()
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "upload", Key: keyfunc.RemoteIP(), Cost: 5,
		Limits: []middleware.Limit{middleware.PerMinute(10)}}})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(ok200)
	for range 3 {
		doFrom(h, "192.0.2.7:1", "/")
	}
	ctx := context.Background()
	charged, _ := lim.TopClients(ctx, "upload", middleware.TopCharged, middleware.TopMinute, 0)
	denied, _ := lim.TopClients(ctx, "upload", middleware.TopDenied, middleware.TopMinute, 0)
	if clientsOf(charged) != "ip:192.0.2.7=10±0" || clientsOf(denied) != "ip:192.0.2.7=5±0" {
		t.Errorf("charged %q, denied %q", clientsOf(charged), clientsOf(denied))
	}
}

// TestTopClientsBound: with more clients than counters, on skewed
// traffic, every listed client's true units are within [Count−Error,
// Count], ErrorBound ≤ Total/K, and every client over the bound is
// listed. Every event is counted (no sampling): the summaries' own
// bounds are tested.
func TestTopClientsBound(t *testing.T) {
	t.Parallel()
	const k = 8
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "api", Key: keyfunc.RemoteIP(), TopClients: k,
		Limits: []middleware.Limit{middleware.PerMinute(1 << 30)}}},
		middleware.WithTopClients(middleware.TopConfig{Samples: -1}))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(ok200)
	z := rand.NewZipf(rand.New(rand.NewPCG(9, 9)), 1.3, 1, 199)
	exact := map[string]uint64{}
	for i := range 5000 {
		n := z.Uint64()
		doFrom(h, "10.0.0."+strconv.FormatUint(n, 10)+":1", "/")
		exact["ip:10.0.0."+strconv.FormatUint(n, 10)]++
		if i%400 == 0 {
			lim.Rates() // drains, as the tracker would
		}
	}
	l, err := lim.TopClients(context.Background(), "api", middleware.TopCharged, middleware.TopMinute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.Total != 5000 || l.ErrorBound*k > l.Total || l.Dropped != 0 {
		t.Fatalf("total %d, bound %d (total/k %d), dropped %d", l.Total, l.ErrorBound, l.Total/k, l.Dropped)
	}
	listed := map[string]bool{}
	for _, c := range l.Clients {
		listed[c.Key] = true
		if f := exact[c.Key]; f > c.Count || f < c.Count-c.Error || c.Error > l.ErrorBound {
			t.Errorf("%s: true %d, count %d ± %d (bound %d)", c.Key, f, c.Count, c.Error, l.ErrorBound)
		}
	}
	for key, f := range exact {
		if f > l.ErrorBound && !listed[key] {
			t.Errorf("%s: %d > bound %d, not listed", key, f, l.ErrorBound)
		}
	}
	if !listed["ip:10.0.0.0"] {
		t.Errorf("the heaviest client is not listed: %q", clientsOf(l))
	}
}

// TestTopClientsConfig: bad settings fail at construction.
func TestTopClientsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  middleware.Option
		rule middleware.Rule
	}{
		{"k of 1", middleware.WithTopClients(middleware.TopConfig{K: 1}), middleware.Rule{}},
		{"negative publish", middleware.WithTopClients(middleware.TopConfig{Publish: -time.Second}), middleware.Rule{}},
		{"ttl under publish", middleware.WithTopClients(middleware.TopConfig{Publish: 5 * time.Second, TTL: time.Second}), middleware.Rule{}},
		{"rule k of 1", nil, middleware.Rule{TopClients: 1}},
	} {
		r := tc.rule
		r.Name, r.Key, r.Limits = "r", keyfunc.RemoteIP(), []middleware.Limit{middleware.PerMinute(1)}
		var opts []middleware.Option
		if tc.opt != nil {
			opts = append(opts, tc.opt)
		}
		if lim, err := middleware.NewRules([]middleware.Rule{r}, opts...); err == nil {
			lim.Close()
			t.Errorf("%s: no error", tc.name)
		}
	}
}

var ok200 = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
