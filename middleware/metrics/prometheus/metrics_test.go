package sluiceprom_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// newMetrics returns Metrics registered with a registry of their own.
func newMetrics(t *testing.T, opts ...sluiceprom.Option) (*sluiceprom.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := sluiceprom.New(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// series gathers reg and returns each sample by its name and labels, as
// `name{a="1",b="2"}` with labels sorted; a histogram gives its _count and
// _sum.
func series(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			name := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				got[name] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				got[name] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				got[strings.Replace(name, "{", "_count{", 1)] = float64(m.GetHistogram().GetSampleCount())
				got[strings.Replace(name, "{", "_sum{", 1)] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("%s: unexpected type %v", mf.GetName(), mf.GetType())
			}
		}
	}
	return got
}

// checkSeries fails unless every series of want has its value in got.
func checkSeries(t *testing.T, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s missing; have %v", k, keys(got))
		} else if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
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

// serve sends a GET for path through h, with X-Key: key unless key is "",
// and returns the status.
func serve(h http.Handler, path, key string) int {
	req := httptest.NewRequest(http.MethodGet, path, nil)
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
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok)
	var codes []int
	for _, r := range []struct{ path, key string }{
		{"/api/a", "alice"}, {"/api/a", "alice"}, {"/api/a", "alice"}, {"/api/a", "bob"},
		{"/api/a", ""}, {"/", ""},
	} {
		codes = append(codes, serve(h, r.path, r.key))
	}
	if want := []int{200, 200, 429, 200, 400, 200}; !slices.Equal(codes, want) {
		t.Fatalf("statuses %v, want %v", codes, want)
	}
	got := series(t, reg)
	checkSeries(t, got, map[string]float64{
		`sluice_decisions_total{outcome="allowed",rule="api"}`: 3,
		`sluice_decisions_total{outcome="denied",rule="api"}`:  1,
		`sluice_decisions_total{outcome="unlimited",rule=""}`:  1,
		`sluice_store_call_duration_seconds_count{}`:           4,
		`sluice_store_errors_total{}`:                          0,
		`sluice_circuit_breaker_open{}`:                        0,
		`sluice_rules_reloads_total{result="ok"}`:              0,
		`sluice_rules_reloads_total{result="error"}`:           0,
	})
	// The request without a key: the limiter may or may not name the
	// rule whose key was missing.
	if n := got[`sluice_decisions_total{outcome="no_key",rule="api"}`] + got[`sluice_decisions_total{outcome="no_key",rule=""}`]; n != 1 {
		t.Errorf("%v no_key decisions, want 1", n)
	}
	// No client key reaches a label.
	for k := range got {
		if strings.Contains(k, "alice") || strings.Contains(k, "bob") {
			t.Errorf("a client's key in %s", k)
		}
	}
	// The Stats gauges appear only once a limiter is watched.
	if _, ok := got[`sluice_memory_keys{}`]; ok {
		t.Errorf("sluice_memory_keys exported with no limiter watched")
	}
	m.Watch(lim)
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_memory_keys{}`:            2, // alice's and bob's counters
		`sluice_memory_evictions_total{}`: 0,
		`sluice_queue_waiting{}`:          0,
		`sluice_concurrency_slots_held{}`: 0,
	})
}

// failingStore fails every call, as a Redis that is down does.
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
		codes   []int
	}{
		{"fail open", nil, "failed_open", []int{200, 200, 200}},
		{"fail local", []middleware.Option{middleware.WithFailurePolicy(middleware.FailLocal)}, "fallback", []int{200, 200, 429}},
		{"fail closed", []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosed)}, "error", []int{503, 503, 503}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m, reg := newMetrics(t)
			opts := append([]middleware.Option{
				middleware.WithStore(failingStore{}),
				middleware.WithBreaker(0, 0), // every request calls the store
				middleware.WithObserver(m),
			}, tt.opts...)
			lim, err := middleware.NewRules(rules(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lim.Close() })
			h := lim.Handler(ok)
			var codes []int
			for range 3 {
				codes = append(codes, serve(h, "/api/a", "alice"))
			}
			if !slices.Equal(codes, tt.codes) {
				t.Fatalf("statuses %v, want %v", codes, tt.codes)
			}
			checkSeries(t, series(t, reg), map[string]float64{
				`sluice_decisions_total{outcome="` + tt.outcome + `",rule="api"}`: 3,
				`sluice_store_call_duration_seconds_count{}`:                      3,
				`sluice_store_errors_total{}`:                                     3,
				`sluice_circuit_breaker_open{}`:                                   0,
			})
		})
	}
}

func TestCircuitBreaker(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(),
		middleware.WithStore(failingStore{}), middleware.WithBreaker(2, time.Hour), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok)
	serve(h, "/api/a", "alice")
	if v := series(t, reg)[`sluice_circuit_breaker_open{}`]; v != 0 {
		t.Fatalf("breaker open = %v after one failure, want 0", v)
	}
	for range 3 {
		serve(h, "/api/a", "alice")
	}
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_circuit_breaker_open{}`:                            1,
		`sluice_store_errors_total{}`:                              2, // the open breaker spares the store
		`sluice_decisions_total{outcome="failed_open",rule="api"}`: 4,
	})
	m.BreakerChanged(false) // as the limiter reports once a probe succeeds
	if v := series(t, reg)[`sluice_circuit_breaker_open{}`]; v != 0 {
		t.Errorf("breaker open = %v after it closed, want 0", v)
	}
}

// remoteStore is an in-memory store that does not look like one, so that
// the limiter puts its deny cache in front of it as it does for Redis.
type remoteStore struct{ middleware.Store }

func TestDenyCacheHits(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
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
	h := lim.Handler(ok)
	for range 5 {
		serve(h, "/api/a", "alice")
	}
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_decisions_total{outcome="allowed",rule="api"}`: 2,
		`sluice_decisions_total{outcome="denied",rule="api"}`:  3,
		`sluice_deny_cache_hits_total{rule="api"}`:             2, // the first denial came from the store
		`sluice_store_call_duration_seconds_count{}`:           3,
	})
}

// TestStoreServerUp: a Redis store whose server refuses connections
// reports it down, under its address.
func TestStoreServerUp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	store, err := middleware.NewRedisStore(rdb, middleware.RedisConfig{Prefix: "test:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithStore(store), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if code := serve(lim.Handler(ok), "/api/a", "alice"); code != 200 {
		t.Fatalf("status %d, want 200 (failed open)", code)
	}
	want := `sluice_store_server_up{server="` + addr + `"}`
	var got map[string]float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if got = series(t, reg); got[want] == 0 {
			if _, ok := got[want]; ok {
				break
			}
		}
	}
	checkSeries(t, got, map[string]float64{
		want: 0,
		`sluice_decisions_total{outcome="failed_open",rule="api"}`: 1,
		`sluice_store_errors_total{}`:                              1,
	})

	m.StoreHealth(middleware.HealthEvent{Server: addr, Up: true})
	m.StoreHealth(middleware.HealthEvent{Up: false, Cause: errDown})
	checkSeries(t, series(t, reg), map[string]float64{want: 1, `sluice_store_server_up{server="store"}`: 0})
}

func TestStats(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	mem, err := middleware.NewMemoryStore(middleware.MemoryConfig{MaxKeys: 2, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "api", Path: "/api/*", Key: keyfunc.Header("X-Key"), Limits: []middleware.Limit{middleware.PerMinute(100)}},
		{Name: "slow", Path: "/slow", Key: keyfunc.Header("X-Key"), Concurrency: 1},
		{Name: "smooth", Path: "/smooth", Key: keyfunc.Header("X-Key"),
			Limits: []middleware.Limit{middleware.PerHour(1).LeakyBucket(5, time.Hour)}},
	}, middleware.WithStore(mem), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	unwatch := m.Watch(lim)

	// Four clients through a store that keeps two counters.
	release := make(chan struct{})
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
	}))
	for _, k := range []string{"a", "b", "c", "d"} {
		serve(h, "/api/x", k)
	}
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_memory_keys{}`:            2,
		`sluice_memory_evictions_total{}`: 2,
	})

	// A request holding its slot, and one waiting its turn.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); serve(h, "/slow", "a") }()
	serve(h, "/smooth", "a") // takes the bucket's only request of the hour
	ctx, cancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() {
		defer wg.Done()
		req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/smooth", nil)
		req.Header.Set("X-Key", "a")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}()
	waitFor(t, reg, map[string]float64{
		`sluice_concurrency_slots_held{}`: 1,
		`sluice_queue_waiting{}`:          1,
	})
	cancel() // the waiting client goes away
	close(release)
	wg.Wait()
	waitFor(t, reg, map[string]float64{
		`sluice_concurrency_slots_held{}`:                         0,
		`sluice_queue_waiting{}`:                                  0,
		`sluice_decisions_total{outcome="gave_up",rule="smooth"}`: 1,
	})

	unwatch()
	if _, ok := series(t, reg)[`sluice_memory_keys{}`]; ok {
		t.Error("sluice_memory_keys exported after unwatch")
	}
}

// waitFor gathers reg until it has every value of want, for at most ten
// seconds.
func waitFor(t *testing.T, reg prometheus.Gatherer, want map[string]float64) {
	t.Helper()
	var got map[string]float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		got = series(t, reg)
		if matches(got, want) {
			return
		}
	}
	checkSeries(t, got, want)
}

func matches(got, want map[string]float64) bool {
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			return false
		}
	}
	return true
}

func TestReloads(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	const good = `rules:
  - name: api
    key: ip
    limits: [{requests: 100, window: 1m}]
`
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	m, reg := newMetrics(t)
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
	m.ObserveReload(err)
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_rules_reloads_total{result="ok"}`:    1,
		`sluice_rules_reloads_total{result="error"}`: 2,
	})
}

// TestRuleLabelCap: rule names past the cap are counted as "other".
func TestRuleLabelCap(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, sluiceprom.WithMaxLabelValues(2))
	var rs []middleware.Rule
	for _, name := range []string{"r1", "r2", "r3", "r4"} {
		rs = append(rs, middleware.Rule{Name: name, Path: "/" + name, Key: keyfunc.Header("X-Key"),
			Limits: []middleware.Limit{middleware.PerMinute(100)}})
	}
	lim, err := middleware.NewRules(rs, middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok)
	for _, p := range []string{"/r1", "/r2", "/r3", "/r4", "/r4", "/r1"} {
		serve(h, p, "k")
	}
	for i := range 5 {
		m.StoreHealth(middleware.HealthEvent{Server: fmt.Sprintf("10.0.0.%d:6379", i), Up: i%2 == 0})
	}
	got := series(t, reg)
	want := map[string]float64{
		`sluice_decisions_total{outcome="allowed",rule="r1"}`:    2,
		`sluice_decisions_total{outcome="allowed",rule="r2"}`:    1,
		`sluice_decisions_total{outcome="allowed",rule="other"}`: 3,
		`sluice_store_server_up{server="10.0.0.0:6379"}`:         1,
		`sluice_store_server_up{server="10.0.0.1:6379"}`:         0,
		`sluice_store_server_up{server="other"}`:                 1, // the last event of 10.0.0.2-4
	}
	checkSeries(t, got, want)
	n := 0
	for k := range got {
		if strings.HasPrefix(k, "sluice_decisions_total") || strings.HasPrefix(k, "sluice_store_server_up") {
			n++
		}
	}
	if n != len(want) {
		t.Errorf("%d series of decisions and servers, want %d: %v", n, len(want), keys(got))
	}
}

func TestOptions(t *testing.T) {
	t.Parallel()
	for _, opts := range [][]sluiceprom.Option{
		{nil},
		{sluiceprom.WithMaxLabelValues(0)},
		{sluiceprom.WithBuckets(nil)},
		{sluiceprom.WithBuckets([]float64{1, 0.5})},
	} {
		if _, err := sluiceprom.New(nil, opts...); err == nil {
			t.Errorf("New(%d options) accepted a bad option", len(opts))
		}
	}
	// Two Metrics on one registry need labels that tell them apart.
	reg := prometheus.NewPedanticRegistry()
	if _, err := sluiceprom.New(reg, sluiceprom.WithConstLabels(prometheus.Labels{"limiter": "public"})); err != nil {
		t.Fatal(err)
	}
	if _, err := sluiceprom.New(reg, sluiceprom.WithConstLabels(prometheus.Labels{"limiter": "public"})); err == nil {
		t.Error("a second Metrics registered with the same labels")
	}
	m, err := sluiceprom.New(reg, sluiceprom.WithConstLabels(prometheus.Labels{"limiter": "admin"}),
		sluiceprom.WithBuckets([]float64{0.001, 0.01}))
	if err != nil {
		t.Fatal(err)
	}
	m.StoreCalled(5*time.Millisecond, nil)
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_store_call_duration_seconds_count{limiter="admin"}`:  1,
		`sluice_store_call_duration_seconds_count{limiter="public"}`: 0,
	})
}

// TestMetricNames: MetricNames lists exactly the metrics a Metrics
// exports, all of which pass Prometheus's naming lint.
func TestMetricNames(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	m.Watch(lim)
	serve(lim.Handler(ok), "/api/a", "alice")
	redisLimiter(t, m, redistest.StandaloneWith(t, "--maxmemory", "64mb")) // the Redis servers' memory
	m.DenyCacheHit("api")
	m.StoreHealth(middleware.HealthEvent{Server: "127.0.0.1:6379", Up: true})
	m.CapacityChanged(middleware.CapacityEvent{Rule: "api", Limit: 12, Spare: 0.5})
	m.ElasticChanged(middleware.ElasticEvent{Rule: "api", Policy: "api", Limit: 10, Ceiling: 50, Effective: 30})
	m.Shed("api", middleware.PrioritySheddable)
	syncEvents(m)
	m.BanStarted("api", time.Hour)
	m.ClientState(1, 2)
	regionEvents(m)
	usageEvents(m)
	outboundEvents(m)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
	}
	want := slices.Clone(sluiceprom.MetricNames)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("exported %v\nMetricNames %v", got, want)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestConcurrentUse: the Metrics takes many goroutines deciding and a
// scrape at once (run with -race).
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, sluiceprom.WithMaxLabelValues(3))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				m.Decided(nil, &middleware.Result{Rule: fmt.Sprintf("r%d", (g+i)%6), Outcome: middleware.OutcomeAllowed})
				m.DenyCacheHit("r0")
				m.StoreCalled(time.Millisecond, nil)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	got := series(t, reg)
	var total float64
	for k, v := range got {
		if strings.HasPrefix(k, "sluice_decisions_total{") {
			total += v
		}
	}
	if total != 8*200 {
		t.Errorf("%v decisions counted, want %d", total, 8*200)
	}
}

// BenchmarkDecided measures what a Metrics adds to each request.
func BenchmarkDecided(b *testing.B) {
	m, err := sluiceprom.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	res := &middleware.Result{Rule: "api", Outcome: middleware.OutcomeAllowed}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decided(nil, res)
			m.StoreCalled(time.Millisecond, nil)
		}
	})
}

// TestStoreBatchSize: the decisions of a real Redis store reach the batch
// size histogram.
func TestStoreBatchSize(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), StallThreshold: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithStore(store), middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	for range 5 {
		serve(lim.Handler(ok), "/api/a", "alice")
	}
	got := series(t, reg)
	if n := got[`sluice_store_batch_size_count{}`]; n < 1 {
		t.Errorf("sluice_store_batch_size_count %v, want the batches of 5 decisions counted", n)
	}
	// Each store call is one decision in a batch (those the deny cache
	// answered never reach Redis).
	if s, calls := got[`sluice_store_batch_size_sum{}`], got[`sluice_store_call_duration_seconds_count{}`]; s != calls || s < 1 {
		t.Errorf("sluice_store_batch_size_sum %v, want the %v decisions sent to Redis", s, calls)
	}
}

// TestRedisStopped reads the metrics after real traffic on a real Redis:
// allowed and denied requests, then the server stopped under the limiter,
// whose requests fail open, are counted, and the server is reported down.
func TestRedisStopped(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	store, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules(rules(), middleware.WithStore(store), middleware.WithObserver(m), middleware.WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	for range 3 {
		serve(lim.Handler(ok), "/api/a", "alice")
	}
	srv.Kill()
	for range 4 {
		if code := serve(lim.Handler(ok), "/api/a", "alice"); code != 200 {
			t.Fatalf("with Redis stopped: %d, want 200 (fail open)", code)
		}
	}
	got := series(t, reg)
	down := 0
	for k, v := range got {
		if strings.HasPrefix(k, "sluice_store_server_up{") && v == 0 {
			down++
		}
	}
	checkSeries(t, got, map[string]float64{
		`sluice_decisions_total{outcome="allowed",rule="api"}`:     2,
		`sluice_decisions_total{outcome="denied",rule="api"}`:      1,
		`sluice_decisions_total{outcome="failed_open",rule="api"}`: 4,
	})
	if got[`sluice_store_errors_total{}`] < 1 || down != 1 {
		t.Errorf("store errors %v, servers down %d; want errors counted and the server down: %v", got[`sluice_store_errors_total{}`], down, got)
	}
}

// TestSourceStatus: ObserveSourceStatus, given as OnStatus to a source
// whose HTTP server fails, sets the failures in a row and the time of the
// last good load.
func TestSourceStatus(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "rules: [{name: api, key: ip, limits: [{requests: 5, window: 1m}]}]")
	}))
	t.Cleanup(srv.Close)
	m, reg := newMetrics(t)
	rl, err := config.OpenSource(context.Background(), &config.HTTPSource{URL: srv.URL}, config.Env{},
		config.SourceOptions{OnStatus: m.ObserveSourceStatus}, middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Limiter().Close() })
	got := series(t, reg)
	if got[`sluice_rules_source_last_load_seconds{}`] < float64(time.Now().Add(-time.Minute).Unix()) || got[`sluice_rules_source_failures{}`] != 0 {
		t.Fatalf("after a good load: %v", got)
	}
	fail.Store(true)
	for range 2 {
		_ = rl.Reload()
	}
	if got := series(t, reg)[`sluice_rules_source_failures{}`]; got != 2 {
		t.Errorf("after two failed reads: failures %v, want 2", got)
	}
}
