package middleware

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
)

// TestTopClientsFleet: three app servers on one real Redis, each
// publishing its summaries; each server's list merges all three (its own
// taken fresh), with the servers that answered and the merged error
// bound checked against exact counts of the fleet's traffic; a server that
// stopped publishing drops out after the TTL.
func TestTopClientsFleet(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	prefix := srv.Prefix(t)
	clk := testclock.New(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	const k = 6
	rules := []Rule{{Name: "api", Key: keyfunc.RemoteIP(), TopClients: k, Limits: []Limit{PerMinute(1 << 30)}}}
	var lims []*Limiter
	for i := range 3 {
		store, err := NewRedisStore(srv.Client(t, nil), RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		lim, err := NewRules(rules, WithStore(store), WithClock(clk.Now),
			WithTopClients(TopConfig{Server: "app" + strconv.Itoa(i), Publish: time.Hour, TTL: 2 * time.Hour, Samples: -1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lim.Close() })
		lims = append(lims, lim)
	}
	// Skewed traffic spread over the servers: more clients than counters.
	z := rand.NewZipf(rand.New(rand.NewPCG(10, 10)), 1.2, 1, 99)
	exact := map[string]uint64{}
	var total uint64
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})
	for i := range 3000 {
		n := strconv.FormatUint(z.Uint64(), 10)
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "10.1.0." + n + ":1"
		res, err := lims[i%3].Decide(keyfunc.FromHTTP(req))
		if err != nil || !res.Allowed {
			t.Fatalf("request %d: %+v, %v", i, res, err)
		}
		if res.Applied { // not when Redis was too slow and the request passed unlimited
			exact["ip:10.1.0."+n]++
			total++
		}
	}
	ctx := context.Background()
	for _, lim := range lims {
		if err := lim.top.t.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, lim := range lims {
		l, err := lim.TopClients(ctx, "api", TopCharged, TopMinute, 0)
		if err != nil || l.FleetErr != nil {
			t.Fatal(err, l.FleetErr)
		}
		// A decision the tracker could not record (it would be counted in
		// Dropped) is short from the totals and the counts.
		if l.Servers != 3 || len(l.ServerNames) != 3 || l.ServerNames[0] != "app0" || l.Total+l.Dropped != total {
			t.Fatalf("server %d: %d servers %v, total %d + dropped %d; want 3 and %d", i, l.Servers, l.ServerNames, l.Total, l.Dropped, total)
		}
		if l.ErrorBound*k > l.Total || l.ErrorBound == 0 {
			t.Errorf("server %d: merged bound %d, want in (0, total/k = %d]", i, l.ErrorBound, l.Total/k)
		}
		listed := map[string]bool{}
		for _, c := range l.Clients {
			listed[c.Key] = true
			if f := exact[c.Key]; f > c.Count+l.Dropped || f < c.Count-c.Error || c.Error > l.ErrorBound {
				t.Errorf("server %d, %s: true %d, count %d ± %d", i, c.Key, f, c.Count, c.Error)
			}
		}
		for key, f := range exact {
			if f > l.ErrorBound+l.Dropped && !listed[key] {
				t.Errorf("server %d: %s has %d > bound %d, not listed", i, key, f, l.ErrorBound)
			}
		}
	}

	// app2 stops. Two minutes later its last write is too old for the
	// minute, not for the hour; past the TTL, it is gone.
	lims[2].Close()
	one := func(lim *Limiter) {
		t.Helper()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "10.1.9.9:1"
		lim.Handler(ok).ServeHTTP(httptest.NewRecorder(), req)
		if err := lim.top.t.Publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	servers := func(p TopPeriod) (int, []string, time.Duration) {
		t.Helper()
		l, err := lims[0].TopClients(ctx, "api", TopCharged, p, 0)
		if err != nil || l.FleetErr != nil {
			t.Fatal(err, l.FleetErr)
		}
		return l.Servers, l.ServerNames, l.Lag
	}
	clk.Add(2 * time.Minute)
	one(lims[1])
	if n, names, _ := servers(TopMinute); n != 2 || names[1] != "app1" {
		t.Errorf("minute, app2 idle for 2 min: %d servers %v, want app0 and app1", n, names)
	}
	if n, _, lag := servers(TopHour); n != 3 || lag != 2*time.Minute {
		t.Errorf("hour, app2 idle for 2 min: %d servers, lag %s; want 3 and 2m", n, lag)
	}
	clk.Add(3 * time.Hour)
	one(lims[1])
	if n, names, _ := servers(TopHour); n != 2 || names[1] != "app1" {
		t.Errorf("hour, app2 gone 3 h: %d servers %v, want app0 and app1", n, names)
	}
}
