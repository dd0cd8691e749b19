package sluiceotel_test

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// prometheusMetrics are sluiceprom's metrics (its MetricNames), their
// types and labels, which sluiceprom's alerting rules and dashboard query.
// This module does not depend on sluiceprom's, so they are copied here.
var prometheusMetrics = map[string]struct {
	typ    dto.MetricType
	labels []string
}{
	"sluice_decisions_total":                 {dto.MetricType_COUNTER, []string{"outcome", "rule"}},
	"sluice_store_call_duration_seconds":     {dto.MetricType_HISTOGRAM, nil},
	"sluice_store_errors_total":              {dto.MetricType_COUNTER, nil},
	"sluice_store_batch_size":                {dto.MetricType_HISTOGRAM, nil},
	"sluice_deny_cache_hits_total":           {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_circuit_breaker_open":            {dto.MetricType_GAUGE, nil},
	"sluice_store_server_up":                 {dto.MetricType_GAUGE, []string{"server"}},
	"sluice_store_server_out_of_memory":      {dto.MetricType_GAUGE, []string{"server"}},
	"sluice_store_server_may_evict":          {dto.MetricType_GAUGE, []string{"server"}},
	"sluice_store_server_evicted_keys_total": {dto.MetricType_COUNTER, []string{"server"}},
	"sluice_memory_keys":                     {dto.MetricType_GAUGE, nil},
	"sluice_memory_evictions_total":          {dto.MetricType_COUNTER, nil},
	"sluice_queue_waiting":                   {dto.MetricType_GAUGE, nil},
	"sluice_concurrency_slots_held":          {dto.MetricType_GAUGE, nil},
	"sluice_rules_reloads_total":             {dto.MetricType_COUNTER, []string{"result"}},
	"sluice_sync_unsynced_total":             {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_sync_flush_duration_seconds":     {dto.MetricType_HISTOGRAM, nil},
	"sluice_sync_flush_errors_total":         {dto.MetricType_COUNTER, nil},
	"sluice_sync_lease_granted_total":        {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_sync_gave_back_total":            {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_sync_dropped_total":              {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_bans_total":                      {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_bans_in_force":                   {dto.MetricType_GAUGE, nil},
	"sluice_overrides_in_force":              {dto.MetricType_GAUGE, nil},
	"sluice_outbound_waits_total":            {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_outbound_wait_seconds":           {dto.MetricType_HISTOGRAM, nil},
	"sluice_outbound_gave_up_total":          {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_outbound_upstream_refused_total": {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_outbound_pauses_total":           {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_outbound_lowered_units_total":    {dto.MetricType_COUNTER, []string{"rule"}},
	"sluice_outbound_learned_limit":          {dto.MetricType_GAUGE, []string{"rule", "unit"}},
	"sluice_outbound_learned_ratio":          {dto.MetricType_GAUGE, []string{"rule", "unit"}},
	"sluice_outbound_cuts_total":             {dto.MetricType_COUNTER, []string{"rule", "unit"}},
}

// TestPrometheusNames: exported through OpenTelemetry's Prometheus
// exporter, the instruments are sluiceprom's metrics, with the same names,
// types and labels, so that its alerts and dashboard apply.
func TestPrometheusNames(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	m, err := sluiceotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
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
	syncEvents(m)
	m.BanStarted("api", time.Hour)
	m.ClientState(1, 2)
	outboundEvents(m)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
		want, ok := prometheusMetrics[mf.GetName()]
		if !ok {
			continue
		}
		if mf.GetType() != want.typ {
			t.Errorf("%s: type %v, want %v", mf.GetName(), mf.GetType(), want.typ)
		}
		for _, s := range mf.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName())
			}
			sort.Strings(labels)
			if !slices.Equal(labels, want.labels) {
				t.Errorf("%s: labels %v, want %v", mf.GetName(), labels, want.labels)
			}
		}
	}
	var want []string
	for name := range prometheusMetrics {
		want = append(want, name)
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("exported %v\nwant %v", got, want)
	}
}
