package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// fleet returns n limiters of rules that share one budget on one Redis,
// each through a client and store of its own, as n processes would.
func fleet(t *testing.T, n int, rules []middleware.Rule, opts ...middleware.Option) []*middleware.Limiter {
	t.Helper()
	srv := redistest.Shared(t)
	prefix := srv.Prefix(t)
	var out []*middleware.Limiter
	for range n {
		s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: prefix, Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out = append(out, newLimiter(t, rules, append([]middleware.Option{middleware.WithStore(s)}, opts...)...))
	}
	return out
}

// hammer sends total requests to url through clients, with perClient
// goroutines each, and returns how many were sent and the errors of those
// that were not (all must be WaitErrors).
func hammer(t *testing.T, clients []*http.Client, perClient, total int, url string) (sent int, unsent []error) {
	t.Helper()
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range clients {
		for range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1)
					if i > int64(total) {
						return
					}
					_, err := get(context.Background(), c, url, strconv.FormatInt(i, 10))
					mu.Lock()
					if err != nil {
						unsent = append(unsent, err)
					} else {
						sent++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for _, err := range unsent {
		var we *outbound.WaitError
		if !errors.As(err, &we) {
			t.Fatalf("a request failed with %v, not a WaitError", err)
		}
	}
	return sent, unsent
}

// sluiceUpstream is sluice's own middleware as an upstream: limit per
// client address, every field (X-RateLimit-*, RateLimit, RateLimit-Policy,
// Retry-After).
func sluiceUpstream(t *testing.T, limit middleware.Limit) *upstream {
	t.Helper()
	up, err := middleware.New(limit, keyfunc.RemoteIP())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = up.Close() })
	h := up.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) { h.ServeHTTP(w, r) })
}

// TestSluiceUpstream: sluice's own middleware as the upstream, 100
// requests per 10 s; two processes share one budget of the same limit on
// Redis, 8 requests in flight each, 140 requests in all. In exact and
// lease mode the upstream refuses none and the fleet sends at most the
// 100 (at least 97 once the upstream's RateLimit-Policy lowered it by the
// margin the transport measured, one unit and what the spread of the
// answers moves; in lease mode at least that less the slices of the other
// process that may be unused when the others give up); in write_back mode
// it may send more by its bound, which the upstream refuses. The requests
// that could not fit fail unsent within the maximum wait. So may a request
// whose maximum wait ran out while the store decided it (a loaded
// machine), which Redis may have counted: those are allowed for in the
// least sent.
func TestSluiceUpstream(t *testing.T) {
	t.Parallel()
	limit := middleware.Limit{Requests: 100, Window: 10 * time.Second}
	for _, tc := range []struct {
		mode     middleware.SyncMode
		lease    int
		unsynced int
	}{
		{middleware.SyncExact, 0, 0},
		{middleware.SyncLease, 10, 0},
		{middleware.SyncWriteBack, 0, 2},
	} {
		interval := time.Duration(0)
		if tc.mode == middleware.SyncWriteBack {
			interval = 10 * time.Millisecond
		}
		t.Run(tc.mode.String(), func(t *testing.T) {
			t.Parallel()
			up := sluiceUpstream(t, limit)
			rules := []middleware.Rule{{Name: "partner", Key: outbound.Host(), Limits: []middleware.Limit{limit},
				Sync: tc.mode, Lease: tc.lease, MaxUnsynced: tc.unsynced, SyncInterval: interval}}
			const maxWait = 300 * time.Millisecond
			var clients []*http.Client
			for _, lim := range fleet(t, 2, rules) {
				clients = append(clients, newClient(t, lim, outbound.Options{MaxWait: maxWait}))
			}
			sent, unsent := hammer(t, clients, 8, 140, up.URL)
			refused := up.refused()
			ok := sent - refused
			// Requests whose maximum wait ran out: those that could not
			// fit are told at once (their turn is past it).
			ranOut := 0
			for _, err := range unsent {
				var we *outbound.WaitError
				if errors.As(err, &we) && we.Waited >= maxWait {
					ranOut++
				}
			}
			t.Logf("%s: sent %d, admitted by the upstream %d, refused %d, not sent %d (%d of them when their maximum wait ran out)", tc.mode, sent, ok, refused, len(unsent), ranOut)
			if sent+len(unsent) != 140 {
				t.Fatalf("%d sent + %d not sent, want 140", sent, len(unsent))
			}
			switch tc.mode {
			case middleware.SyncExact:
				// The first answers' RateLimit-Policy lowered the limit
				// by its margin.
				if sent+ranOut < 97 || sent > 100 || refused != 0 {
					t.Errorf("exact: sent %d (refused %d, %d ran out of wait), want 97 to 100 less those and none refused", sent, refused, ranOut)
				}
			case middleware.SyncLease:
				if sent > 100 || sent+ranOut < 97-tc.lease || refused != 0 {
					t.Errorf("lease: sent %d (refused %d, %d ran out of wait), want %d to 100 (the least less those) and none refused", sent, refused, ranOut, 97-tc.lease)
				}
			case middleware.SyncWriteBack:
				// The stated bound: processes × MaxUnsynced over the
				// limit, plus what the fleet sends in one SyncInterval.
				bound := 2*tc.unsynced + mostWithin(up.got(), interval)
				if over := sent - 100; over > bound || refused != max(over, 0) {
					t.Errorf("write_back: sent %d (refused %d), want at most %d over the limit, all refused", sent, refused, bound)
				}
			}
		})
	}
}

// mostWithin returns the most arrivals in any interval of length d.
func mostWithin(as []arrival, d time.Duration) int {
	most := 0
	for i := range as {
		n := 0
		for _, b := range as {
			if !b.at.Before(as[i].at) && b.at.Sub(as[i].at) < d {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// TestMemoryPerProcess: with the memory store each process has the whole
// budget to itself.
func TestMemoryPerProcess(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	rules := hostRule(middleware.PerMinute(10))
	a := newClient(t, newLimiter(t, rules), outbound.Options{MaxWait: -1})
	b := newClient(t, newLimiter(t, rules), outbound.Options{MaxWait: -1})
	for i, c := range []*http.Client{a, b} {
		if sent, unsent := hammer(t, []*http.Client{c}, 2, 15, up.URL); sent != 10 || len(unsent) != 5 {
			t.Errorf("process %d on a memory store sent %d of 15 (not sent %d), want 10", i, sent, len(unsent))
		}
	}
}

// github imitates GitHub's primary rate limit: limit requests per window
// of whole seconds, X-RateLimit-Limit (unless announce is false), -Remaining,
// -Used, -Resource and -Reset as a Unix time; past the limit, 403 (as
// GitHub answers) with X-RateLimit-Remaining: 0 and no Retry-After.
func github(limit int, window time.Duration, announce bool) func(w http.ResponseWriter, r *http.Request, n int) {
	var mu sync.Mutex
	var start time.Time
	used := 0
	return func(w http.ResponseWriter, r *http.Request, _ int) {
		mu.Lock()
		now := time.Now()
		if now.Sub(start) >= window {
			start, used = now.Truncate(time.Second), 0
		}
		reset := start.Add(window)
		if reset.Before(now) {
			reset = now.Truncate(time.Second).Add(window)
		}
		ok := used < limit
		if ok {
			used++
		}
		h := w.Header()
		if announce {
			h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
		}
		h.Set("X-RateLimit-Remaining", strconv.Itoa(limit-used))
		h.Set("X-RateLimit-Used", strconv.Itoa(used))
		h.Set("X-RateLimit-Resource", "core")
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintln(w, `{"message":"API rate limit exceeded"}`)
		}
	}
}

// TestGitHubLike: an upstream that counts more strictly than the fleet is
// configured (20 requests per second against 100) and says so as GitHub
// does (X-RateLimit-Limit, with resets a second apart). The fleet learns
// its quota from the first answers and sends under it, less the margin:
// the refusals come from the requests in flight before the first answers,
// at most those in flight per window, and when the upstream says none are
// left the fleet pauses until its reset.
func TestGitHubLike(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, github(20, time.Second, true))
	lims := fleet(t, 2, hostRule(middleware.PerSecond(100)))
	var clients []*http.Client
	for _, lim := range lims {
		clients = append(clients, newClient(t, lim, outbound.Options{MaxWait: 5 * time.Second}))
	}
	const inFlight = 2 * 4
	sent, unsent := hammer(t, clients, 4, 50, up.URL)
	if len(unsent) > 0 {
		t.Fatalf("%d requests not sent: %v", len(unsent), unsent[0])
	}
	perWindow := map[int64][2]int{} // ok, refused
	for _, a := range up.got() {
		c := perWindow[a.at.Unix()]
		if a.status == http.StatusOK {
			c[0]++
		} else {
			c[1]++
		}
		perWindow[a.at.Unix()] = c
	}
	ok := 0
	for sec, c := range perWindow {
		ok += c[0]
		if c[1] > inFlight {
			t.Errorf("second %d: %d refused, more than the %d in flight", sec, c[1], inFlight)
		}
	}
	t.Logf("sent %d, ok %d, refused %d, windows %v", sent, ok, sent-ok, perWindow)
	if ok < 40 {
		t.Errorf("%d requests answered 200 of %d sent", ok, sent)
	}
	for i, lim := range lims {
		l := lim.Learned()
		if len(l) != 1 || len(l[0].Quotas) != 1 || l[0].Quotas[0].Units != 20 || l[0].Limits[0].Requests > 19 {
			t.Errorf("limiter %d learned %+v; want the quota of 20, a limit of 19 at most", i, l)
		}
	}
}

// llm imitates an LLM provider's limits on requests and tokens per
// window (OpenAI's fields: x-ratelimit-limit-, -remaining- and -reset-
// requests and tokens, the resets as durations such as "1s" or "6m0s"):
// each request uses the tokens of its X-Tokens header; past either limit,
// 429 with Retry-After in seconds.
func llm(requests, tokens int, window time.Duration) func(w http.ResponseWriter, r *http.Request, n int) {
	var mu sync.Mutex
	var start time.Time
	var usedReq, usedTok int
	return func(w http.ResponseWriter, r *http.Request, _ int) {
		cost, _ := strconv.Atoi(r.Header.Get("X-Tokens"))
		mu.Lock()
		now := time.Now()
		if now.Sub(start) >= window {
			start, usedReq, usedTok = now, 0, 0
		}
		left := start.Add(window).Sub(now)
		ok := usedReq < requests && usedTok+cost <= tokens
		if ok {
			usedReq++
			usedTok += cost
		}
		h := w.Header()
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(requests))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(requests-usedReq))
		h.Set("x-ratelimit-reset-requests", left.Round(time.Millisecond).String())
		h.Set("x-ratelimit-limit-tokens", strconv.Itoa(tokens))
		h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(tokens-usedTok))
		h.Set("x-ratelimit-reset-tokens", left.Round(time.Millisecond).String())
		mu.Unlock()
		if !ok {
			h.Set("Retry-After", strconv.Itoa(int((left+time.Second-1)/time.Second)))
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}
}

// TestLLMLike: an LLM provider that allows 30 requests and 1,000 tokens
// per second, against a fleet configured for 100 requests and 4,000
// tokens a second; each request uses 100 tokens, reserved with WithCost
// and settled with what the provider used. When the provider reports no
// tokens left, the fleet pauses until its reset; refusals are at most the
// requests in flight.
func TestLLMLike(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, llm(30, 1000, time.Second))
	rules := []middleware.Rule{{Name: "llm", Key: outbound.Host(), Limits: []middleware.Limit{middleware.PerSecond(100)},
		Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerSecond(4000)}, EstimateFunc: outbound.Cost}}}
	var pauses atomic.Int64
	lims := fleet(t, 2, rules, middleware.WithObserver(&middleware.Hooks{OnOutbound: func(e middleware.OutboundEvent) {
		if e.Kind == middleware.OutboundPaused {
			pauses.Add(1)
		}
	}}))
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	for _, lim := range lims {
		c := newClient(t, lim, outbound.Options{MaxWait: 5 * time.Second, Usage: func(resp *http.Response) (int, bool) {
			n, err := strconv.Atoi(resp.Request.Header.Get("X-Tokens")) // a provider reports it in its body
			return n, err == nil
		}})
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 6 {
					req, _ := http.NewRequestWithContext(outbound.WithCost(context.Background(), 100), "POST", up.URL, nil)
					req.Header.Set("X-Tokens", "100")
					resp, err := c.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					resp.Body.Close()
					sent.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	got := up.got()
	refused := up.refused()
	t.Logf("sent %d, refused %d, pauses %d, not sent %d", sent.Load(), refused, pauses.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d requests not sent within 5 s", failed.Load())
	}
	if pauses.Load() == 0 {
		t.Error("no pause: the fleet did not follow x-ratelimit-remaining-tokens: 0")
	}
	// 10 requests spend a second's tokens; 6 are in flight at most.
	perSecond := map[int64]int{}
	for _, a := range got {
		if a.status == http.StatusTooManyRequests {
			perSecond[a.at.Unix()]++
		}
	}
	for sec, n := range perSecond {
		if n > 6 {
			t.Errorf("second %d: %d refused, more than the 6 in flight", sec, n)
		}
	}
}

// TestRandom429: an upstream whose real limit is stricter than the one
// configured, so that it refuses at random, with Retry-After: 1. Each
// refusal pauses the fleet (two processes on Redis, lease mode, 4 requests
// in flight each): from the moment the pause is written, the upstream
// receives only the requests that were already in flight then, at most one
// per client goroutine, until the pause ends.
func TestRandom429(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(35, 1))
	var rmu sync.Mutex
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		rmu.Lock()
		refuse := n > 5 && rng.IntN(10) == 0
		rmu.Unlock()
		if refuse {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	type pause struct {
		written time.Time
		d       time.Duration
	}
	var pmu sync.Mutex
	var pauses []pause
	hooks := &middleware.Hooks{OnOutbound: func(e middleware.OutboundEvent) {
		if e.Kind == middleware.OutboundPaused {
			pmu.Lock()
			pauses = append(pauses, pause{time.Now(), e.Duration})
			pmu.Unlock()
		}
	}}
	rules := []middleware.Rule{{Name: "partner", Key: outbound.Host(), Limits: []middleware.Limit{middleware.PerSecond(200)}, Sync: middleware.SyncLease, Lease: 5}}
	var clients []*http.Client
	for _, lim := range fleet(t, 2, rules, middleware.WithObserver(hooks)) {
		clients = append(clients, newClient(t, lim, outbound.Options{MaxWait: 10 * time.Second}))
	}
	const inFlight = 2 * 4
	sent, unsent := hammer(t, clients, 4, 40, up.URL)
	if len(unsent) > 0 {
		t.Fatalf("%d requests not sent: %v", len(unsent), unsent[0])
	}
	got := up.got()
	pmu.Lock()
	defer pmu.Unlock()
	for i, p := range pauses {
		if p.d != time.Second {
			t.Errorf("pause %d lasts %v, want the Retry-After's 1s", i, p.d)
		}
		// Arrivals after the write, until shortly before the end.
		during := 0
		for _, a := range got {
			if a.at.After(p.written) && a.at.Before(p.written.Add(p.d-20*time.Millisecond)) {
				during++
			}
		}
		if during > inFlight {
			t.Errorf("pause %d written at %v: %d requests arrived during it, more than the %d that can be in flight",
				i, p.written.Format("15:04:05.000"), during, inFlight)
		}
	}
	t.Logf("sent %d, refused %d, pauses %d", sent, up.refused(), len(pauses))
	if len(pauses) == 0 || up.refused() == 0 {
		t.Fatal("the upstream refused nothing: the test tested nothing")
	}
}

// TestLearnPolicy: an upstream that announces a quota below the
// configured limit (sluice's RateLimit-Policy: 20 a second, against 40)
// has the Limiter's budget for the key lowered to it, less a margin, from
// the first answer on: learned, not an override; and the fleet then sends
// at the upstream's rate with few refusals.
func TestLearnPolicy(t *testing.T) {
	t.Parallel()
	up := sluiceUpstream(t, middleware.PerSecond(20))
	var learned atomic.Int64
	lim := newLimiter(t, hostRule(middleware.PerSecond(40)), middleware.WithObserver(&middleware.Hooks{
		OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundLearned {
				learned.Store(int64(e.Units))
			}
		}}))
	c := newClient(t, lim, outbound.Options{MaxWait: 2 * time.Second})
	if _, err := get(context.Background(), c, up.URL, "first"); err != nil {
		t.Fatal(err)
	}
	key := "host:" + up.Listener.Addr().String()
	if o, ok := lim.Override("upstream", key); ok {
		t.Errorf("an override was set: %+v", o)
	}
	l := lim.Learned()
	if len(l) != 1 || l[0].Key != key || len(l[0].Quotas) != 1 || l[0].Quotas[0] != (middleware.Quota{Units: 20, Window: time.Second}) ||
		l[0].Limits[0].Requests != 19 || l[0].Configured[0].Requests != 40 {
		t.Fatalf("learned after the first answer: %+v; want the quota of 20 a second, 19 (a margin of 1)", l)
	}
	if n := learned.Load(); n != 19 {
		t.Errorf("OutboundLearned reported %d, want 19", n)
	}
	sent, unsent := hammer(t, []*http.Client{c}, 4, 30, up.URL)
	t.Logf("sent %d, refused %d, not sent %d", sent, up.refused(), len(unsent))
	if r := up.refused(); r > 4 {
		t.Errorf("%d refused after the limit followed the upstream's", r)
	}
}

// TestIgnoreUpstream: with IgnoreUpstream the fields change nothing.
func TestIgnoreUpstream(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	lim, err := middleware.NewRules(hostRule(middleware.PerSecond(100)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	c := newClient(t, lim, outbound.Options{IgnoreUpstream: true})
	for i := range 3 {
		if status, err := get(context.Background(), c, up.URL, strconv.Itoa(i)); err != nil || status != 429 {
			t.Fatalf("request %d: %d, %v; want the upstream's 429", i, status, err)
		}
	}
}

// TestHostileFields: an upstream that answers with a Retry-After of ten
// years pauses for MaxPause only; garbage and negative values pause
// nothing.
func TestHostileFields(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retryAfter string
		pause      time.Duration
	}{
		{"315360000", 2 * time.Second}, // ten years, capped at MaxPause
		{"-30", 0},
		{"soon", 0},
		{"1e9", 0},
		{"Wed, 21 Oct 2015 07:28:00 GMT", 0}, // passed
	} {
		t.Run(tc.retryAfter, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 1 {
					w.Header().Set("Retry-After", tc.retryAfter)
					w.Header().Set("X-RateLimit-Remaining", "-5")
					w.Header().Set("RateLimit", `"x";r=-1;t=99999999999`)
					w.WriteHeader(http.StatusTooManyRequests)
				}
			})
			var paused time.Duration
			lim := newLimiter(t, hostRule(middleware.PerSecond(100)), middleware.WithObserver(&middleware.Hooks{
				OnOutbound: func(e middleware.OutboundEvent) {
					if e.Kind == middleware.OutboundPaused {
						paused = e.Duration
					}
				}}))
			c := newClient(t, lim, outbound.Options{MaxPause: 2 * time.Second, MaxWait: -1})
			if status, err := get(context.Background(), c, up.URL, "1"); err != nil || status != 429 {
				t.Fatalf("first request: %d, %v", status, err)
			}
			_, err := get(context.Background(), c, up.URL, "2")
			var we *outbound.WaitError
			switch {
			case tc.pause == 0 && err != nil:
				t.Errorf("second request: %v; want it sent, no pause", err)
			case tc.pause > 0 && (!errors.As(err, &we) || !we.Paused || we.RetryAfter > tc.pause):
				t.Errorf("second request: %v; want it held by a pause of at most %v", err, tc.pause)
			}
			if paused != tc.pause {
				t.Errorf("paused for %v, want %v", paused, tc.pause)
			}
		})
	}
}
