package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// hotLimit is never reached in the hot-path benchmarks: every request is
// allowed, so the allow path is what is measured.
var hotLimit = middleware.PerSecond(1 << 40 / 1000)

// hotCase is one row of the hot-path budget: a step of a decision, or a
// decision with one capability configured.
type hotCase struct {
	name string
	// opts and rules make the Limiter of a decide case; rules nil means
	// the one rule New makes (every request, keyfunc.RemoteIP()).
	opts  func() []middleware.Option
	rules func() []middleware.Rule
	// setup prepares the Limiter once built (an override, say).
	setup func(b *testing.B, lim *middleware.Limiter)
	// denied says that every decision (after the warm-up) is a denial.
	denied bool
	// run, if set, replaces the decision: a step measured alone. It gets
	// the requests and returns a function that each goroutine calls once
	// for what it then does per request.
	run func(b *testing.B, reqs []*http.Request) func() func(i int)
}

// otherRule is a rule that no request of the benchmark matches (its path
// is another), made with mod: what a capability costs the requests of the
// rules that do not use it.
func otherRule(mod func(*middleware.Rule)) middleware.Rule {
	r := middleware.Rule{Name: "other", Path: "/other/*", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(10)}}
	if mod != nil {
		mod(&r)
	}
	return r
}

// mainRule is the rule every request of the benchmark matches, made with
// mod.
func mainRule(mod func(*middleware.Rule)) middleware.Rule {
	r := middleware.Rule{Name: middleware.DefaultRuleName, Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{hotLimit}}
	if mod != nil {
		mod(&r)
	}
	return r
}

var (
	withBan     = func(r *middleware.Rule) { r.Limits[0].Ban = time.Minute }
	withCeiling = func(r *middleware.Rule) { r.Limits[0].Ceiling = 2 * r.Limits[0].Requests }
	withSlots   = func(r *middleware.Rule) { r.Concurrency = 1 << 30 }
	withUsage   = func(r *middleware.Rule) {
		r.Usage = &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{hotLimit}}
	}
	// withEvery is every capability a rule can have that costs the
	// requests of other rules nothing. An elastic limit (withCeiling) is
	// not one: its capacity signal measures every request the Limiter
	// admits (see elastic-other).
	withEvery    = func(r *middleware.Rule) { withBan(r); withUsage(r); withSlots(r) }
	noTopClients = middleware.WithTopClients(middleware.TopConfig{Off: true})
)

// hotCases are the rows of the hot-path budget, in the order printed.
var hotCases = []hotCase{
	// The steps of a decision, each alone.
	{name: "step/key", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		key := keyfunc.RemoteIP()
		return shared(func(i int) {
			if k, err := key(keyfunc.FromHTTP(reqs[i%len(reqs)])); err != nil || k == "" {
				b.Fatal(k, err)
			}
		})
	}},
	{name: "step/match-none", rules: func() []middleware.Rule { return []middleware.Rule{otherRule(nil)} }},
	{name: "step/store", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		st, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		keys := make([]string, len(reqs))
		for i, r := range reqs {
			keys[i], _ = keyfunc.RemoteIP()(keyfunc.FromHTTP(r))
		}
		return func() func(int) {
			cs := make([]middleware.Charge, 1)
			ds := make([]middleware.Decision, 1)
			return func(i int) {
				cs[0] = middleware.Charge{Key: keys[i%len(keys)], Name: middleware.DefaultRuleName, Limit: hotLimit, Cost: 1}
				if ok, err := st.Take(context.Background(), time.Time{}, cs, ds); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		}
	}},
	{name: "step/headers", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		lim, err := middleware.New(hotLimit, keyfunc.RemoteIP())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lim.Close() })
		res, err := lim.Decide(keyfunc.FromHTTP(reqs[0]))
		if err != nil || !res.Applied {
			b.Fatal(res, err)
		}
		return func() func(int) {
			h := make(http.Header, 8)
			return func(int) {
				clear(h)
				lim.WriteHeaders(h, &res)
			}
		}
	}},
	{name: "decide"},
	{name: "handler", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		h := hotLimiter(b, nil).Handler(bare)
		return func() func(int) {
			w := &discardWriter{h: make(http.Header, 8)}
			return func(i int) {
				clear(w.h)
				h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		}
	}},
	{name: "handler-recorder", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		h := hotLimiter(b, nil).Handler(bare)
		return shared(func(i int) { h.ServeHTTP(httptest.NewRecorder(), reqs[i%len(reqs)]) })
	}},
	{name: "baseline-recorder", run: func(b *testing.B, reqs []*http.Request) func() func(int) {
		return shared(func(i int) { bare.ServeHTTP(httptest.NewRecorder(), reqs[i%len(reqs)]) })
	}},

	// A decision with one capability configured (and used by the
	// request's rule), or configured on another rule only (-other): the
	// -other rows must cost what plain-other does.
	{name: "feature/top-off", opts: func() []middleware.Option { return []middleware.Option{noTopClients} }},
	{name: "feature/observer", opts: func() []middleware.Option {
		return []middleware.Option{middleware.WithObserver(&decisionCounter{})}
	}},
	{name: "feature/ban", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(withBan)} }},
	{name: "feature/pauses", opts: func() []middleware.Option { return []middleware.Option{middleware.WithPauses()} }},
	{name: "feature/override", setup: func(b *testing.B, lim *middleware.Limiter) {
		// Some client's override: every request looks for its own.
		err := lim.SetOverride(context.Background(), middleware.Override{Rule: middleware.DefaultRuleName, Key: "ip:192.0.2.1",
			Limits: []middleware.Limit{middleware.PerMinute(5)}})
		if err != nil {
			b.Fatal(err)
		}
	}},
	{name: "feature/usage", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(withUsage)} }},
	{name: "feature/elastic", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(withCeiling)} }},
	{name: "feature/concurrency", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(withSlots)} }},
	{name: "feature/plain-other", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(nil), otherRule(nil)} }},
	{name: "feature/ban-other", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(nil), otherRule(withBan)} }},
	{name: "feature/usage-other", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(nil), otherRule(withUsage)} }},
	{name: "feature/concurrency-other", rules: func() []middleware.Rule {
		return []middleware.Rule{mainRule(nil), otherRule(withSlots)}
	}},
	{name: "feature/every-other", rules: func() []middleware.Rule { return []middleware.Rule{mainRule(nil), otherRule(withEvery)} }},
	{name: "feature/elastic-other", rules: func() []middleware.Rule {
		return []middleware.Rule{mainRule(nil), otherRule(withCeiling)}
	}},

	// A flood of denied requests (each client spent its one request a
	// minute in the warm-up), with the top clients tracked and not: a
	// denial must cost no more than an admission.
	{name: "denied/top-on", denied: true, rules: spentRule},
	{name: "denied/top-off", denied: true, rules: spentRule, opts: func() []middleware.Option { return []middleware.Option{noTopClients} }},
}

// spentRule is a rule of one request a minute.
func spentRule() []middleware.Rule {
	return []middleware.Rule{{Name: middleware.DefaultRuleName, Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(1)}}}
}

// hotLimiter returns a Limiter of c's rules and options (New's one rule and
// the defaults when c is nil), closed when b ends.
func hotLimiter(b *testing.B, c *hotCase) *middleware.Limiter {
	var rules []middleware.Rule
	var opts []middleware.Option
	if c != nil && c.rules != nil {
		rules = c.rules()
	} else {
		rules = []middleware.Rule{mainRule(nil)}
	}
	if c != nil && c.opts != nil {
		opts = c.opts()
	}
	lim, err := middleware.NewRules(rules, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lim.Close() })
	if c != nil && c.setup != nil {
		c.setup(b, lim)
	}
	return lim
}

// BenchmarkHotPath is the hot-path budget (make bench-hot): what each step
// of a decision costs alone, and what a decision costs with each
// capability configured, on one hot key and on 100,000 keys, from every
// core at once (b.RunParallel). cpu-ns/op is the process's CPU time per
// request, every thread included: the top-client tracker's drainer and
// the GC count. Every decision must be an admission, with its limit
// applied (the step/match-none row applies none: no rule matches).
func BenchmarkHotPath(b *testing.B) {
	const distinct = 100_000
	all := make([]*http.Request, distinct)
	for i := range all {
		all[i] = httptest.NewRequest(http.MethodGet, "/", nil)
		all[i].RemoteAddr = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":1234"
	}
	for _, keys := range []struct {
		name string
		reqs []*http.Request
	}{{"hot", all[:1]}, {"100k", all}} {
		for _, c := range hotCases {
			b.Run(keys.name+"/"+c.name, func(b *testing.B) {
				var each func() func(int)
				if c.run != nil {
					each = c.run(b, keys.reqs)
				} else {
					lim := hotLimiter(b, &c)
					if c.denied {
						for _, r := range keys.reqs { // every client spends its request
							_, _ = lim.Decide(keyfunc.FromHTTP(r))
						}
					}
					each = shared(decideOne(b, lim, keys.reqs, c.name == "step/match-none", c.denied))
				}
				one := each()
				for i := range keys.reqs { // every key seen before timing
					one(i)
				}
				var next atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				cpu := processCPU()
				b.RunParallel(func(pb *testing.PB) {
					one := each()
					i := int(next.Add(7919))
					for pb.Next() {
						one(i)
						i++
					}
				})
				b.StopTimer()
				if cpu := processCPU() - cpu; cpu > 0 {
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
				}
			})
		}
	}
}

// shared returns a function that hands every goroutine one, which needs
// no state of its own.
func shared(one func(int)) func() func(int) { return func() func(int) { return one } }

// decideOne returns a function deciding request i of reqs and finishing
// it as a front end does, failing b unless it was allowed (denied when
// denied is set) and, unless none is, with a limit applied.
func decideOne(b *testing.B, lim *middleware.Limiter, reqs []*http.Request, none, denied bool) func(int) {
	return func(i int) {
		res, err := lim.Decide(keyfunc.FromHTTP(reqs[i%len(reqs)]))
		if err != nil || res.Allowed == denied || res.Applied == none {
			b.Fatalf("%+v, %v", res, err)
		}
		res.Finish(http.StatusOK)
	}
}

// TestUnusedCapabilitiesCostNothing: a capability configured on another
// rule than the request's (a ban, a usage limit, a concurrency limit, all
// three), an override of another client, or pauses with none in force,
// adds no allocation to a decision, which makes none (BenchmarkHotPath's
// feature rows show the time).
func TestUnusedCapabilitiesCostNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	r := keyfunc.FromHTTP(get("192.0.2.1:1"))
	for _, c := range []struct {
		name     string
		other    func(*middleware.Rule) // a second rule, the request's not
		opts     []middleware.Option
		override bool // another client has an override
	}{
		{name: "plain"},
		{name: "ban on another rule", other: withBan},
		{name: "usage on another rule", other: withUsage},
		{name: "concurrency on another rule", other: withSlots},
		{name: "all on another rule", other: withEvery},
		{name: "another client's override", override: true},
		{name: "pauses, none in force", opts: []middleware.Option{middleware.WithPauses()}},
	} {
		rules := []middleware.Rule{mainRule(nil)}
		if c.other != nil {
			rules = append(rules, otherRule(c.other))
		}
		lim, err := middleware.NewRules(rules, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer lim.Close()
		if c.override {
			err := lim.SetOverride(context.Background(), middleware.Override{Rule: middleware.DefaultRuleName, Key: "ip:192.0.2.99",
				Limits: []middleware.Limit{middleware.PerMinute(5)}})
			if err != nil {
				t.Fatal(err)
			}
		}
		decide := func() {
			res, err := lim.Decide(r)
			if err != nil || !res.Allowed || !res.Applied {
				t.Fatalf("%s: %+v, %v", c.name, res, err)
			}
			res.Finish(http.StatusOK)
		}
		decide()
		if allocs := testing.AllocsPerRun(200, decide); allocs != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", c.name, allocs)
		}
	}
}
