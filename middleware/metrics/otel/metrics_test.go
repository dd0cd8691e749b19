package sluiceotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// newMetrics returns Metrics on a MeterProvider with a ManualReader.
func newMetrics(t *testing.T, opts ...sluiceotel.Option) (*sluiceotel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	m, err := sluiceotel.New(mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, reader
}

// collect reads every data point, as `name{a="1",b="2"}` with attributes
// sorted; a histogram gives its count as name_count.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	key := func(name string, set attribute.Set) string {
		var ls []string
		for _, kv := range set.ToSlice() {
			ls = append(ls, fmt.Sprintf("%s=%q", kv.Key, kv.Value.Emit()))
		}
		sort.Strings(ls)
		return name + "{" + strings.Join(ls, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != sluiceotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, sluiceotel.ScopeName)
		}
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					got[key(md.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					got[key(md.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					got[key(md.Name, p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					got[key(md.Name+"_count", p.Attributes)] = float64(p.Count)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					got[key(md.Name+"_count", p.Attributes)] = float64(p.Count)
					got[key(md.Name+"_sum", p.Attributes)] = float64(p.Sum)
				}
			default:
				t.Fatalf("%s: unexpected data %T", md.Name, md.Data)
			}
		}
	}
	return got
}

func checkPoints(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s missing; have %v", k, keys(got))
		} else if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
}

// totals sums the points of collect by metric name, whatever their
// attributes.
func totals(got map[string]float64) map[string]float64 {
	sum := map[string]float64{}
	for k, v := range got {
		name, _, _ := strings.Cut(k, "{")
		sum[name] += v
	}
	return sum
}

func keys(m map[string]float64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// rules are those of most tests: "api" allows 2 a minute per X-Key, and
// requests elsewhere are not limited.
func rules() []middleware.Rule {
	return []middleware.Rule{{
		Name: "api", Path: "/api/*", Key: keyfunc.Header("X-Key"),
		Limits: []middleware.Limit{middleware.PerMinute(2)},
	}}
}

// serve sends a GET for path through h in ctx, with X-Key: key unless key
// is "", and returns the status.
func serve(ctx context.Context, h http.Handler, path, key string) int {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	if key != "" {
		req.Header.Set("X-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

var ok = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

func TestDecisions(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok)
	ctx := context.Background()
	var codes []int
	for _, r := range []struct{ path, key string }{
		{"/api/a", "alice"}, {"/api/a", "alice"}, {"/api/a", "alice"}, {"/api/a", "bob"}, {"/", ""},
	} {
		codes = append(codes, serve(ctx, h, r.path, r.key))
	}
	if want := []int{200, 200, 429, 200, 200}; !slices.Equal(codes, want) {
		t.Fatalf("statuses %v, want %v", codes, want)
	}
	got := collect(t, reader)
	checkPoints(t, got, map[string]float64{
		`sluice.decisions{outcome="allowed",rule="api"}`: 3,
		`sluice.decisions{outcome="denied",rule="api"}`:  1,
		`sluice.decisions{outcome="unlimited",rule=""}`:  1,
		`sluice.store.call.duration_count{}`:             4,
		`sluice.store.errors{}`:                          0,
		`sluice.circuit_breaker.open{}`:                  0,
		`sluice.rules.reloads{result="ok"}`:              0,
		`sluice.rules.reloads{result="error"}`:           0,
	})
	for k := range got {
		if strings.Contains(k, "alice") || strings.Contains(k, "bob") {
			t.Errorf("a client's key in %s", k)
		}
	}
	if _, ok := got[`sluice.memory.keys{}`]; ok {
		t.Errorf("sluice.memory.keys observed with no limiter watched")
	}
	unwatch := m.Watch(lim)
	checkPoints(t, collect(t, reader), map[string]float64{
		`sluice.memory.keys{}`:            2,
		`sluice.memory.evictions{}`:       0,
		`sluice.queue.waiting{}`:          0,
		`sluice.concurrency.slots_held{}`: 0,
	})
	unwatch()
	if _, ok := collect(t, reader)[`sluice.memory.keys{}`]; ok {
		t.Errorf("sluice.memory.keys observed after unwatch")
	}
}

type failingStore struct{}

var errDown = errors.New("connection refused")

func (failingStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	return false, errDown
}

func TestStoreFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    []middleware.Option
		outcome string
	}{
		{"fail open", nil, "failed_open"},
		{"fail local", []middleware.Option{middleware.WithFailurePolicy(middleware.FailLocal)}, "fallback"},
		{"fail closed", []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosed)}, "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, reader := newMetrics(t)
			opts := append([]middleware.Option{
				middleware.WithStore(failingStore{}), middleware.WithBreaker(0, 0), middleware.WithObserver(m),
			}, tt.opts...)
			lim, err := middleware.NewRules(rules(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lim.Close() })
			for range 3 {
				serve(context.Background(), lim.Handler(ok), "/api/a", "alice")
			}
			checkPoints(t, collect(t, reader), map[string]float64{
				`sluice.decisions{outcome="` + tt.outcome + `",rule="api"}`: 3,
				`sluice.store.call.duration_count{}`:                        3,
				`sluice.store.errors{}`:                                     3,
			})
		})
	}
}

func TestBreakerAndHealth(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t, sluiceotel.WithMaxLabelValues(2))
	lim, err := middleware.NewRules(rules(),
		middleware.WithStore(failingStore{}), middleware.WithBreaker(2, time.Hour), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	for range 3 {
		serve(context.Background(), lim.Handler(ok), "/api/a", "alice")
	}
	m.StoreHealth(middleware.HealthEvent{Server: "10.0.0.1:6379", Up: false, Cause: errDown})
	m.StoreHealth(middleware.HealthEvent{Up: true})
	m.StoreHealth(middleware.HealthEvent{Server: "10.0.0.2:6379", Up: false})
	checkPoints(t, collect(t, reader), map[string]float64{
		`sluice.circuit_breaker.open{}`:                  1,
		`sluice.store.errors{}`:                          2,
		`sluice.store.server.up{server="10.0.0.1:6379"}`: 0,
		`sluice.store.server.up{server="store"}`:         1,
		`sluice.store.server.up{server="other"}`:         0,
	})
	m.BreakerChanged(false)
	checkPoints(t, collect(t, reader), map[string]float64{`sluice.circuit_breaker.open{}`: 0})
}

type remoteStore struct{ middleware.Store }

func TestDenyCacheHits(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	mem, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	lim, err := middleware.NewRules(rules(), middleware.WithStore(remoteStore{mem}), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	for range 5 {
		serve(context.Background(), lim.Handler(ok), "/api/a", "alice")
	}
	checkPoints(t, collect(t, reader), map[string]float64{
		`sluice.decisions{outcome="denied",rule="api"}`: 3,
		`sluice.deny_cache.hits{rule="api"}`:            2,
	})
}

func TestReloads(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("rules: [{name: api, key: ip, limits: [{requests: 100, window: 1m}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, reader := newMetrics(t)
	rl, err := config.Open(path, config.Env{}, middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Limiter().Close() })
	m.ObserveReload(rl.Reload())
	if err := os.WriteFile(path, []byte("rules: [{name: api, key: ip, limits: [{requests: 0, window: 1m}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = rl.Reload()
	if err == nil {
		t.Fatal("bad rules reloaded")
	}
	m.ObserveReload(err)
	checkPoints(t, collect(t, reader), map[string]float64{
		`sluice.rules.reloads{result="ok"}`:    1,
		`sluice.rules.reloads{result="error"}`: 1,
	})
}

func TestRuleCapAndAttributes(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t, sluiceotel.WithMaxLabelValues(2), sluiceotel.WithAttributes(attribute.String("limiter", "public")))
	for _, rule := range []string{"r1", "r2", "r3", "r4", "r1"} {
		m.Decided(nil, &middleware.Result{Rule: rule, Outcome: middleware.OutcomeAllowed})
	}
	m.Decided(nil, &middleware.Result{Rule: "r1", Outcome: middleware.Outcome(200)})
	got := collect(t, reader)
	checkPoints(t, got, map[string]float64{
		`sluice.decisions{limiter="public",outcome="allowed",rule="r1"}`:    2,
		`sluice.decisions{limiter="public",outcome="allowed",rule="r2"}`:    1,
		`sluice.decisions{limiter="public",outcome="allowed",rule="other"}`: 2,
		`sluice.decisions{limiter="public",outcome="unknown",rule="r1"}`:    1,
		`sluice.store.errors{limiter="public"}`:                             0,
	})
}

func TestOptions(t *testing.T) {
	t.Parallel()
	mp := sdkmetric.NewMeterProvider()
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	if _, err := sluiceotel.New(nil); err == nil {
		t.Error("New accepted a nil MeterProvider")
	}
	for _, opts := range [][]sluiceotel.Option{
		{nil},
		{sluiceotel.WithMaxLabelValues(-1)},
		{sluiceotel.WithBuckets([]float64{2, 1})},
	} {
		if _, err := sluiceotel.New(mp, opts...); err == nil {
			t.Errorf("New(%d options) accepted a bad option", len(opts))
		}
	}
}

// TestMetricNames: MetricNames lists exactly the instruments a Metrics
// reports.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	m.Watch(lim)
	serve(context.Background(), lim.Handler(ok), "/api/a", "alice")
	redisLimiter(t, m, redistest.StandaloneWith(t, "--maxmemory", "64mb")) // the Redis servers' memory
	m.DenyCacheHit("api")
	m.StoreHealth(middleware.HealthEvent{Server: "127.0.0.1:6379", Up: true})
	m.StoreBatch(3)
	m.ObserveSourceStatus(config.Status{Failures: 1, LoadedAt: time.Now()})
	m.CapacityChanged(middleware.CapacityEvent{Rule: "api", Limit: 12, Spare: 0.5})
	m.ElasticChanged(middleware.ElasticEvent{Rule: "api", Policy: "api", Limit: 10, Ceiling: 50, Effective: 30})
	m.Shed("api", middleware.PrioritySheddable)
	syncEvents(m)
	m.BanStarted("api", time.Hour)
	m.ClientState(1, 2)
	regionEvents(m)
	usageEvents(m)
	outboundEvents(m)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			got = append(got, md.Name)
		}
	}
	want := slices.Clone(sluiceotel.MetricNames)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("reported %v\nMetricNames %v", got, want)
	}
}

// TestSpanEvents: a decision is an event of the request's span, with the
// rule, outcome, allowed, policy, remaining, cost and retry_after, and
// never the key.
func TestSpanEvents(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")

	m, _ := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok)
	for _, path := range []string{"/api/a", "/api/a", "/api/a", "/"} {
		ctx, span := tracer.Start(context.Background(), "GET "+path)
		serve(ctx, h, path, "alice")
		span.End()
	}
	// A request without a span, and one whose span is not recording.
	serve(context.Background(), h, "/api/a", "alice")
	ntp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSyncer(exp))
	ctx, span := ntp.Tracer("test").Start(context.Background(), "unsampled")
	serve(ctx, h, "/api/a", "alice")
	span.End()

	spans := exp.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4", len(spans))
	}
	var got []string
	for _, s := range spans {
		if len(s.Events) != 1 || s.Events[0].Name != sluiceotel.DecisionEvent {
			t.Fatalf("span %s: events %v, want one %s", s.Name, s.Events, sluiceotel.DecisionEvent)
		}
		var kvs []string
		for _, kv := range s.Events[0].Attributes {
			kvs = append(kvs, fmt.Sprintf("%s=%v", kv.Key, kv.Value.Emit()))
			if strings.Contains(kv.Value.Emit(), "alice") {
				t.Errorf("span %s: the client's key in %s", s.Name, kv.Key)
			}
		}
		got = append(got, strings.Join(kvs, " "))
	}
	want := []string{
		"sluice.rule=api sluice.outcome=allowed sluice.allowed=true sluice.policy=api sluice.remaining=1 sluice.cost=1",
		"sluice.rule=api sluice.outcome=allowed sluice.allowed=true sluice.policy=api sluice.remaining=0 sluice.cost=1",
		"sluice.rule=api sluice.outcome=denied sluice.allowed=false sluice.policy=api sluice.remaining=0 sluice.cost=1 sluice.retry_after=",
		"sluice.rule= sluice.outcome=unlimited sluice.allowed=true",
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("event %d: %s, want %s…", i, got[i], want[i])
		}
	}

	// Off with WithSpanEvents(false).
	exp.Reset()
	quiet, _ := newMetrics(t, sluiceotel.WithSpanEvents(false))
	lim2, err := middleware.NewRules(rules(), middleware.WithObserver(quiet))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim2.Close() })
	ctx, span = tracer.Start(context.Background(), "quiet")
	serve(ctx, lim2.Handler(ok), "/api/a", "alice")
	span.End()
	if s := exp.GetSpans(); len(s) != 1 || len(s[0].Events) != 0 {
		t.Errorf("events with WithSpanEvents(false): %v", s)
	}
}

// TestConcurrentUse: many goroutines deciding while the reader collects
// (run with -race).
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t, sluiceotel.WithMaxLabelValues(3))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				m.Decided(nil, &middleware.Result{Rule: fmt.Sprintf("r%d", (g+i)%6), Outcome: middleware.OutcomeDenied})
				m.StoreCalled(time.Millisecond, nil)
				m.StoreHealth(middleware.HealthEvent{Server: fmt.Sprintf("s%d", i%5), Up: i%2 == 0})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	var total float64
	for k, v := range collect(t, reader) {
		if strings.HasPrefix(k, "sluice.decisions{") {
			total += v
		}
	}
	if total != 8*200 {
		t.Errorf("%v decisions, want %d", total, 8*200)
	}
}

// BenchmarkDecided measures what a Metrics adds to each request.
func BenchmarkDecided(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	m, err := sluiceotel.New(mp)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	res := &middleware.Result{Rule: "api", Outcome: middleware.OutcomeAllowed}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decided(nil, res)
			m.StoreCalled(time.Millisecond, nil)
		}
	})
}

// TestSpanEventsFreeWithoutTracer: without a recording span (no
// TracerProvider, or a span not sampled), the span events cost Decided no
// allocation: it allocates as much as with the events off.
func TestSpanEventsFreeWithoutTracer(t *testing.T) {
	on, _ := newMetrics(t)
	off, _ := newMetrics(t, sluiceotel.WithSpanEvents(false))
	ntp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { ntp.Shutdown(context.Background()) })
	unsampled, span := ntp.Tracer("test").Start(context.Background(), "unsampled")
	defer span.End()
	res := &middleware.Result{Allowed: true, Applied: true, Rule: "api", Policy: "api", Remaining: 3, Cost: 1, Outcome: middleware.OutcomeAllowed}
	for name, ctx := range map[string]context.Context{"no span": context.Background(), "unsampled span": unsampled} {
		r := keyfunc.FromHTTP(httptest.NewRequest("GET", "/api/a", nil).WithContext(ctx))
		on.Decided(r, res) // the attribute sets of the rule exist
		off.Decided(r, res)
		withEvents := testing.AllocsPerRun(200, func() { on.Decided(r, res) })
		without := testing.AllocsPerRun(200, func() { off.Decided(r, res) })
		if withEvents != without {
			t.Errorf("%s: %v allocations per decision with span events, %v without", name, withEvents, without)
		}
	}
}

// BenchmarkDecidedSpan: what Decided costs without a span, with an
// unsampled one, and with a recording one (the event and its attributes).
func BenchmarkDecidedSpan(b *testing.B) {
	m, err := sluiceotel.New(sdkmetric.NewMeterProvider())
	if err != nil {
		b.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter())))
	ntp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	res := &middleware.Result{Allowed: true, Applied: true, Rule: "api", Policy: "api", Remaining: 3, Cost: 1, Outcome: middleware.OutcomeAllowed}
	unsampled, _ := ntp.Tracer("b").Start(context.Background(), "unsampled")
	recording, _ := tp.Tracer("b").Start(context.Background(), "recording")
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"no-span", context.Background()}, {"unsampled", unsampled}, {"recording", recording}} {
		b.Run(c.name, func(b *testing.B) {
			r := keyfunc.FromHTTP(httptest.NewRequest("GET", "/api/a", nil).WithContext(c.ctx))
			b.ReportAllocs()
			for b.Loop() {
				m.Decided(r, res)
			}
		})
	}
}
