// Package sluiceotel records what a sluice Limiter does with OpenTelemetry:
// metrics through a metric.MeterProvider, and each decision as an event on
// the request's span.
//
// It is a module of its own, so that programs that do not use it never
// download OpenTelemetry. A Metrics is a middleware.Observer, given to the
// limiter with middleware.WithObserver:
//
//	m, err := sluiceotel.New(otel.GetMeterProvider())
//	if err != nil { … }
//	defer m.Close()
//	lim, err := middleware.NewRules(rules, middleware.WithObserver(m))
//	if err != nil { … }
//	m.Watch(lim) // memory, queue and slot figures, observed at collection
//	go reloader.Watch(ctx, 10*time.Second, m.ObserveReload)
//
// # Instruments
//
// The instruments are those of package sluiceprom (module
// middleware/metrics/prometheus), named as OpenTelemetry names them: dots
// between the parts of a name, units as metadata rather than suffixes, no
// _total. An OpenTelemetry exporter to Prometheus, which turns dots into
// underscores and adds the unit and _total suffixes, exports them under
// sluiceprom's names, so that its alerting rules and Grafana dashboard
// apply unchanged:
//
//	OpenTelemetry name             instrument                    unit       attributes     Prometheus name
//	sluice.decisions               Int64Counter                  {request}  rule, outcome  sluice_decisions_total
//	sluice.store.call.duration     Float64Histogram              s                         sluice_store_call_duration_seconds
//	sluice.store.errors            Int64Counter                  {error}                   sluice_store_errors_total
//	sluice.store.batch.size        Int64Histogram                {decision}                sluice_store_batch_size
//	sluice.deny_cache.hits         Int64Counter                  {request}  rule           sluice_deny_cache_hits_total
//	sluice.circuit_breaker.open    Int64ObservableGauge                                    sluice_circuit_breaker_open
//	sluice.store.server.up         Int64ObservableGauge                     server         sluice_store_server_up
//	sluice.store.server.out_of_memory Int64ObservableGauge                  server         sluice_store_server_out_of_memory
//	sluice.store.server.may_evict  Int64ObservableGauge                     server         sluice_store_server_may_evict
//	sluice.store.server.evicted_keys Int64ObservableCounter      {key}      server         sluice_store_server_evicted_keys_total
//	sluice.memory.keys             Int64ObservableUpDownCounter  {key}                     sluice_memory_keys
//	sluice.memory.evictions        Int64ObservableCounter        {key}                     sluice_memory_evictions_total
//	sluice.queue.waiting           Int64ObservableUpDownCounter  {request}                 sluice_queue_waiting
//	sluice.concurrency.slots_held  Int64ObservableUpDownCounter  {slot}                    sluice_concurrency_slots_held
//	sluice.rules.reloads           Int64Counter                  {reload}   result         sluice_rules_reloads_total
//	sluice.rules.source.failures   Int64Gauge                    {read}                    sluice_rules_source_failures
//	sluice.rules.source.last_load  Float64Gauge                  s                         sluice_rules_source_last_load_seconds
//	sluice.adaptive.limit          Int64Gauge                    {request}  rule           sluice_adaptive_limit
//	sluice.spare_capacity          Float64Gauge                  1          rule           sluice_spare_capacity
//	sluice.elastic.limit           Int64Gauge                    {request}  rule, policy   sluice_elastic_limit
//	sluice.shed                    Int64Counter                  {request}  rule, priority sluice_shed_total
//	sluice.sync.unsynced           Int64Counter                  {unit}     rule           sluice_sync_unsynced_total
//	sluice.sync.flush.duration     Float64Histogram              s                         sluice_sync_flush_duration_seconds
//	sluice.sync.flush.errors       Int64Counter                  {run}                     sluice_sync_flush_errors_total
//	sluice.sync.lease.granted      Int64Counter                  {unit}     rule           sluice_sync_lease_granted_total
//	sluice.sync.gave_back          Int64Counter                  {unit}     rule           sluice_sync_gave_back_total
//	sluice.sync.dropped            Int64Counter                  {unit}     rule           sluice_sync_dropped_total
//	sluice.bans                    Int64Counter                  {ban}      rule           sluice_bans_total
//	sluice.bans.in_force           Int64Gauge                    {ban}                     sluice_bans_in_force
//	sluice.overrides.in_force      Int64Gauge                    {override}                sluice_overrides_in_force
//	sluice.region.peer.lag         Float64Histogram              s          peer           sluice_region_peer_lag_seconds
//	sluice.region.sync.errors      Int64Counter                  {sync}     peer           sluice_region_sync_errors_total
//	sluice.region.peer.unreachable Int64UpDownCounter            {region}   peer           sluice_region_peer_unreachable
//	sluice.region.dropped          Int64Counter                  {counter}                 sluice_region_dropped_total
//	sluice.usage.settled           Int64Counter                  {unit}     rule, policy   sluice_usage_settled_total
//	sluice.usage.refunded          Int64Counter                  {unit}     rule, policy   sluice_usage_refunded_total
//	sluice.usage.debt              Int64Histogram                {unit}     rule, policy   sluice_usage_debt
//	sluice.usage.settle_errors     Int64Counter                  {settle}   rule           sluice_usage_settle_errors_total
//	sluice.outbound.waits          Int64Counter                  {request}  rule           sluice_outbound_waits_total
//	sluice.outbound.wait           Float64Histogram              s                         sluice_outbound_wait_seconds
//	sluice.outbound.gave_up        Int64Counter                  {request}  rule           sluice_outbound_gave_up_total
//	sluice.outbound.upstream_refused Int64Counter                {request}  rule           sluice_outbound_upstream_refused_total
//	sluice.outbound.pauses         Int64Counter                  {pause}    rule           sluice_outbound_pauses_total
//	sluice.outbound.lowered_units  Int64Counter                  {unit}     rule           sluice_outbound_lowered_units_total
//	sluice.outbound.learned_limit  Int64Gauge                    {unit}     rule, unit     sluice_outbound_learned_limit
//	sluice.outbound.learned_ratio  Float64Gauge                  1          rule, unit     sluice_outbound_learned_ratio
//	sluice.outbound.cuts           Int64Counter                  {cut}      rule, unit     sluice_outbound_cuts_total
//
// MetricNames lists the OpenTelemetry names. The attribute values are
// those of sluiceprom: outcome is middleware.Outcome's String ("allowed",
// "denied", "failed_open", …), result is "ok" or "error", rule and server
// are capped (WithMaxLabelValues), the rest counted under OtherLabel. No
// attribute carries a client's key.
//
// # Span events
//
// When the request's context holds a recording span (one started by
// otelhttp under a configured TracerProvider, say), Decided adds to it the
// event "sluice.decision" with the attributes sluice.rule,
// sluice.outcome and sluice.allowed; sluice.policy, sluice.remaining and
// sluice.cost (what the request was charged under the binding limit) when
// a limit applied; and sluice.retry_after, in seconds, when the request
// was denied (-1 when no wait would help). The client's key is never
// recorded. A request with usage limits (middleware.Usage) that settles
// what it used gets the event "sluice.settle" too, with sluice.rule,
// sluice.policy, sluice.settled_cost (what it used in all), sluice.charged
// (the difference charged, negative when given back) and sluice.debt,
// and sluice.error when the store failed to count it.
// Without a recording span (no TracerProvider, or a span not sampled)
// the events cost one look-up in the context and allocate nothing.
// WithSpanEvents(false) turns them off.
//
// docs/operations.md describes the metrics and the span events beside
// the other ways of watching a Limiter; docs/usage.md, docs/fleet.md,
// docs/regions.md, docs/overload.md and docs/outbound.md say what their
// capability's instruments mean.
package sluiceotel

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/labelcap"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// ScopeName is the instrumentation scope of the Meter a Metrics uses.
const ScopeName = "github.com/sluicehq/sluice/middleware/metrics/otel"

// The names of the instruments.
const (
	Decisions          = "sluice.decisions"
	StoreCallDuration  = "sluice.store.call.duration"
	StoreErrors        = "sluice.store.errors"
	StoreBatchSize     = "sluice.store.batch.size"
	DenyCacheHits      = "sluice.deny_cache.hits"
	CircuitBreakerOpen = "sluice.circuit_breaker.open"
	StoreServerUp      = "sluice.store.server.up"
	// StoreServerOutOfMemory, StoreServerMayEvict and
	// StoreServerEvictedKeys are a Redis server's memory, observed from
	// the watched limiters' Health (Watch).
	StoreServerOutOfMemory = "sluice.store.server.out_of_memory"
	StoreServerMayEvict    = "sluice.store.server.may_evict"
	StoreServerEvictedKeys = "sluice.store.server.evicted_keys"
	MemoryKeys             = "sluice.memory.keys"
	MemoryEvictions        = "sluice.memory.evictions"
	QueueWaiting           = "sluice.queue.waiting"
	ConcurrencySlotsHeld   = "sluice.concurrency.slots_held"
	RulesReloads           = "sluice.rules.reloads"
	RulesSourceFailures    = "sluice.rules.source.failures"
	RulesSourceLastLoad    = "sluice.rules.source.last_load"
)

// MetricNames lists the name of every instrument a Metrics creates.
var MetricNames = []string{
	Decisions,
	StoreCallDuration,
	StoreErrors,
	StoreBatchSize,
	DenyCacheHits,
	CircuitBreakerOpen,
	StoreServerUp,
	StoreServerOutOfMemory,
	StoreServerMayEvict,
	StoreServerEvictedKeys,
	MemoryKeys,
	MemoryEvictions,
	QueueWaiting,
	ConcurrencySlotsHeld,
	RulesReloads,
	RulesSourceFailures,
	RulesSourceLastLoad,
	AdaptiveLimit,
	SpareCapacity,
	ElasticLimit,
	Shed,
	SyncUnsynced,
	SyncFlushDuration,
	SyncFlushErrors,
	SyncLeaseGranted,
	SyncGaveBack,
	SyncDropped,
	BansStarted,
	Bans,
	Overrides,
	RegionPeerLag,
	RegionSyncErrors,
	RegionPeerUnreachable,
	RegionDropped,
	UsageSettled,
	UsageRefunded,
	UsageDebt,
	UsageErrors,
	OutboundWaits,
	OutboundWait,
	OutboundGaveUp,
	OutboundUpstreamRefused,
	OutboundPauses,
	OutboundLoweredUnits,
	OutboundLearnedLimit,
	OutboundLearnedRatio,
	OutboundCuts,
}

// DecisionEvent is the name of the span event Decided adds.
const DecisionEvent = "sluice.decision"

// DefaultBuckets are the bucket bounds, in seconds, that the store call
// duration histogram advises: from 100µs to 1s, as sluiceprom's.
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// DefaultMaxLabelValues is how many distinct values of the rule attribute,
// and of the server attribute, a Metrics records by default.
const DefaultMaxLabelValues = 1000

// OtherLabel is the value of the rule or server attribute that counts the
// values past the cap (see WithMaxLabelValues).
const OtherLabel = "other"

// StoreLabel is the value of the server attribute of a health event about
// the store as a whole (middleware.HealthEvent with no Server).
const StoreLabel = "store"

// Option configures a Metrics.
type Option func(*options)

type options struct {
	maxValues  int
	buckets    []float64
	attrs      []attribute.KeyValue
	spanEvents bool
	errs       []error
}

// WithMaxLabelValues caps at n the distinct values of the rule attribute
// and, separately, of the server attribute (DefaultMaxLabelValues by
// default); values past the first n seen are recorded as OtherLabel. n
// must be positive.
func WithMaxLabelValues(n int) Option {
	return func(o *options) {
		if n <= 0 {
			o.errs = append(o.errs, fmt.Errorf("sluiceotel: WithMaxLabelValues: want n > 0, got %d", n))
			return
		}
		o.maxValues = n
	}
}

// WithBuckets sets the bucket bounds, in seconds, that the store call
// duration histogram advises, in increasing order. The default is
// DefaultBuckets. A View of the MeterProvider may override them.
func WithBuckets(b []float64) Option {
	return func(o *options) {
		if len(b) == 0 || !sort.Float64sAreSorted(b) {
			o.errs = append(o.errs, fmt.Errorf("sluiceotel: WithBuckets: want increasing bounds, got %v", b))
			return
		}
		o.buckets = append([]float64(nil), b...)
	}
}

// WithAttributes adds attributes to every measurement, such as
// attribute.String("limiter", "public"), to tell apart several limiters
// whose Metrics share a MeterProvider.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(o *options) { o.attrs = append(o.attrs, attrs...) }
}

// WithSpanEvents turns the "sluice.decision" span events on (the default)
// or off.
func WithSpanEvents(on bool) Option {
	return func(o *options) { o.spanEvents = on }
}

// Metrics records what the limiters it observes do. It implements
// middleware.Observer and is safe for concurrent use. Given to several
// limiters, it adds up what they do.
type Metrics struct {
	max   int
	attrs []attribute.KeyValue
	base  metric.MeasurementOption // the WithAttributes ones alone
	// Options made once as slices, so that passing them does not allocate.
	baseAdd    []metric.AddOption
	baseRecord []metric.RecordOption
	spanEvents bool

	decisions     metric.Int64Counter
	storeDuration metric.Float64Histogram
	storeErrors   metric.Int64Counter
	batchSize     metric.Int64Histogram
	denyHits      metric.Int64Counter
	reloads       metric.Int64Counter
	srcFailures   metric.Int64Gauge
	srcLoaded     metric.Float64Gauge
	reloadOK      []metric.AddOption
	reloadErr     []metric.AddOption

	breaker, serverUp       metric.Int64ObservableGauge
	oom, mayEvict           metric.Int64ObservableGauge
	memKeys, waiting, slots metric.Int64ObservableUpDownCounter
	evictions, evictedKeys  metric.Int64ObservableCounter
	registration            metric.Registration
	closeOnce               sync.Once

	breakersOpen atomic.Int64
	rules        *labelcap.Table[ruleSeries] // read lock-free on every request
	serversMu    sync.Mutex
	servers      map[string]bool // by attribute value; true when up
	watchMu      sync.Mutex
	watched      map[*watch]struct{}

	capacity capacityInstruments // capacity.go
	sync     syncInstruments     // sync.go
	clients  clientInstruments   // clients.go
	region   regionInstruments   // region.go
	usage    usageInstruments    // usage.go
	outbound outboundInstruments // outbound.go
}

type watch struct{ lim *middleware.Limiter }

var (
	_ middleware.Observer = (*Metrics)(nil)
)

// New returns a Metrics that records through a Meter of mp named
// ScopeName. It returns an error for an invalid option or when mp refuses
// an instrument. Close unregisters the callback that observes the gauges.
func New(mp metric.MeterProvider, opts ...Option) (*Metrics, error) {
	if mp == nil {
		return nil, errors.New("sluiceotel: nil MeterProvider")
	}
	o := options{maxValues: DefaultMaxLabelValues, buckets: DefaultBuckets, spanEvents: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("sluiceotel: nil Option")
		}
		opt(&o)
	}
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	m := &Metrics{
		max:        o.maxValues,
		attrs:      o.attrs,
		spanEvents: o.spanEvents,
		servers:    map[string]bool{},
		watched:    map[*watch]struct{}{},
	}
	m.base = metric.WithAttributeSet(attribute.NewSet(o.attrs...))
	m.baseAdd = []metric.AddOption{m.base}
	m.baseRecord = []metric.RecordOption{m.base}
	m.reloadOK = []metric.AddOption{m.with(attribute.String("result", "ok"))}
	m.reloadErr = []metric.AddOption{m.with(attribute.String("result", "error"))}
	m.rules = labelcap.New(m.max, OtherLabel, m.newRuleSeries)

	meter := mp.Meter(ScopeName)
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var err error
	m.decisions, err = meter.Int64Counter(Decisions, metric.WithUnit("{request}"),
		metric.WithDescription("Requests the rate limiter decided, by rule and outcome (allowed, denied, shadow_denied, failed_open, fallback, no_key, error, unlimited, gave_up)."))
	check(err)
	m.storeDuration, err = meter.Float64Histogram(StoreCallDuration, metric.WithUnit("s"),
		metric.WithDescription("How long calls of the rate limiter's store took, failed ones included."),
		metric.WithExplicitBucketBoundaries(o.buckets...))
	check(err)
	m.storeErrors, err = meter.Int64Counter(StoreErrors, metric.WithUnit("{error}"),
		metric.WithDescription("Calls of the rate limiter's store that failed."))
	check(err)
	m.batchSize, err = meter.Int64Histogram(StoreBatchSize, metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions per batch a Redis store sent to a server in one round trip."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256))
	check(err)
	m.denyHits, err = meter.Int64Counter(DenyCacheHits, metric.WithUnit("{request}"),
		metric.WithDescription("Requests the deny cache turned away without asking the store, by the rule that denied them."))
	check(err)
	m.reloads, err = meter.Int64Counter(RulesReloads, metric.WithUnit("{reload}"),
		metric.WithDescription("Reloads of the rules tried, by result: ok when the new rules are in force, error when the previous ones stay."))
	check(err)
	m.srcFailures, err = meter.Int64Gauge(RulesSourceFailures, metric.WithUnit("{read}"),
		metric.WithDescription("Reads of the rules source (config.Source) that failed in a row; 0 once it answers again."))
	check(err)
	m.srcLoaded, err = meter.Float64Gauge(RulesSourceLastLoad, metric.WithUnit("s"),
		metric.WithDescription("Unix time, in seconds, of the last good load of the rules from their source."))
	check(err)
	m.breaker, err = meter.Int64ObservableGauge(CircuitBreakerOpen,
		metric.WithDescription("1 while the circuit breaker of a rate limiter is open and its store is not called, 0 otherwise."))
	check(err)
	m.serverUp, err = meter.Int64ObservableGauge(StoreServerUp,
		metric.WithDescription("1 while a server of the rate limiter's store answers, 0 while it is down; only servers that went down at least once are listed."))
	check(err)
	m.oom, err = meter.Int64ObservableGauge(StoreServerOutOfMemory,
		metric.WithDescription("1 while a Redis server of the rate limiter's store refuses writes for want of memory (an OOM reply in the last 10 s): requests that would write go to the failure policy. Observed from the watched limiters."))
	check(err)
	m.mayEvict, err = meter.Int64ObservableGauge(StoreServerMayEvict,
		metric.WithDescription("1 while a Redis server of the rate limiter's store has a maxmemory and a maxmemory-policy other than noeviction: it may evict counters, whose clients then start afresh. Observed from the watched limiters."))
	check(err)
	m.evictedKeys, err = meter.Int64ObservableCounter(StoreServerEvictedKeys, metric.WithUnit("{key}"),
		metric.WithDescription("Keys a Redis server of the rate limiter's store evicted since it started (its evicted_keys, read every RedisConfig.MemoryCheck). Observed from the watched limiters."))
	check(err)
	m.memKeys, err = meter.Int64ObservableUpDownCounter(MemoryKeys, metric.WithUnit("{key}"),
		metric.WithDescription("Counters the rate limiter's in-memory stores hold (the store or the fail-local fallback)."))
	check(err)
	m.evictions, err = meter.Int64ObservableCounter(MemoryEvictions, metric.WithUnit("{key}"),
		metric.WithDescription("Counters the rate limiter's in-memory stores dropped to stay within their MaxKeys."))
	check(err)
	m.waiting, err = meter.Int64ObservableUpDownCounter(QueueWaiting, metric.WithUnit("{request}"),
		metric.WithDescription("Requests waiting for their turn in a leaky bucket's queue."))
	check(err)
	m.slots, err = meter.Int64ObservableUpDownCounter(ConcurrencySlotsHeld, metric.WithUnit("{slot}"),
		metric.WithDescription("Requests holding concurrency slots."))
	check(err)
	check(m.initCapacity(meter))
	check(m.initSync(meter))
	check(m.initClients(meter))
	check(m.initRegion(meter))
	check(m.initUsage(meter))
	check(m.initOutbound(meter))
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("sluiceotel: %w", err)
	}
	// The reload counter starts at zero for both results, so that an alert
	// on an increase of errors sees the first one.
	m.reloads.Add(context.Background(), 0, m.reloadOK...)
	m.reloads.Add(context.Background(), 0, m.reloadErr...)
	m.storeErrors.Add(context.Background(), 0, m.baseAdd...)
	m.registration, err = meter.RegisterCallback(m.observe, m.breaker, m.serverUp, m.memKeys, m.evictions, m.waiting, m.slots,
		m.oom, m.mayEvict, m.evictedKeys)
	if err != nil {
		return nil, fmt.Errorf("sluiceotel: %w", err)
	}
	return m, nil
}

// with returns the measurement option of the WithAttributes attributes and
// kv.
func (m *Metrics) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	all := make([]attribute.KeyValue, 0, len(m.attrs)+len(kv))
	all = append(append(all, m.attrs...), kv...)
	return metric.WithAttributeSet(attribute.NewSet(all...))
}

// Close stops observing the gauges: it unregisters their callback from
// the MeterProvider. The counters stay with the MeterProvider.
func (m *Metrics) Close() error {
	var err error
	m.closeOnce.Do(func() { err = m.registration.Unregister() })
	return err
}

// Watch has the Metrics observe lim's Stats at each collection: the
// up-down counters sluice.memory.keys, sluice.queue.waiting and
// sluice.concurrency.slots_held and the counter sluice.memory.evictions,
// added up over the watched limiters, and the memory of their stores'
// Redis servers from their Health (sluice.store.server.out_of_memory,
// sluice.store.server.may_evict and sluice.store.server.evicted_keys, for
// servers whose figures were read), all observed only while at least one
// is watched. The limiter is made after the Metrics, since it takes the
// Metrics as an option. unwatch stops observing lim; call it if lim is
// closed before the Metrics.
func (m *Metrics) Watch(lim *middleware.Limiter) (unwatch func()) {
	if lim == nil {
		return func() {}
	}
	w := &watch{lim: lim}
	m.watchMu.Lock()
	m.watched[w] = struct{}{}
	m.watchMu.Unlock()
	return func() {
		m.watchMu.Lock()
		delete(m.watched, w)
		m.watchMu.Unlock()
	}
}

// ObserveReload counts a reload of the rules: pass it as the onReload
// function of config.Reloader.Watch, or call it with the error of
// Reloader.Reload. A nil err counts under result "ok", any other under
// "error".
func (m *Metrics) ObserveReload(err error) {
	if err == nil {
		m.reloads.Add(context.Background(), 1, m.reloadOK...)
	} else {
		m.reloads.Add(context.Background(), 1, m.reloadErr...)
	}
}

// ObserveSourceStatus records the rules source's failures in a row and the
// time of its last good load from st: use it as
// config.SourceOptions.OnStatus (or call it from yours).
func (m *Metrics) ObserveSourceStatus(st config.Status) {
	ctx := context.Background()
	m.srcFailures.Record(ctx, int64(st.Failures), m.baseRecord...)
	if !st.LoadedAt.IsZero() {
		m.srcLoaded.Record(ctx, float64(st.LoadedAt.UnixMilli())/1000, m.baseRecord...)
	}
}

// Decided counts the decision under its rule and outcome, in the request's
// context (so that exemplars can point to its trace), and adds the
// "sluice.decision" event to the request's span if it is recording. It
// implements middleware.Observer.
func (m *Metrics) Decided(r keyfunc.Request, res *middleware.Result) {
	if res == nil {
		return
	}
	ctx := context.Background()
	if r != nil {
		if c := r.Context(); c != nil {
			ctx = c
		}
	}
	o := int(res.Outcome)
	if o >= numOutcomes {
		o = 0 // "unknown"
	}
	m.decisions.Add(ctx, 1, m.rules.Get(res.Rule).decisions[o]...)
	if !m.spanEvents {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs,
		attribute.String("sluice.rule", res.Rule),
		attribute.String("sluice.outcome", res.Outcome.String()),
		attribute.Bool("sluice.allowed", res.Allowed))
	if res.Applied || res.Concurrency {
		attrs = append(attrs,
			attribute.String("sluice.policy", res.Policy),
			attribute.Int("sluice.remaining", res.Remaining),
			attribute.Int("sluice.cost", res.Cost))
	}
	if res.RetryAfter < 0 {
		attrs = append(attrs, attribute.Float64("sluice.retry_after", -1))
	} else if res.RetryAfter > 0 {
		attrs = append(attrs, attribute.Float64("sluice.retry_after", res.RetryAfter.Seconds()))
	}
	span.AddEvent(DecisionEvent, trace.WithAttributes(attrs...))
}

// StoreCalled records the duration of a store call and counts it as an
// error if err is not nil. It implements middleware.Observer.
func (m *Metrics) StoreCalled(d time.Duration, err error) {
	ctx := context.Background()
	m.storeDuration.Record(ctx, d.Seconds(), m.baseRecord...)
	if err != nil {
		m.storeErrors.Add(ctx, 1, m.baseAdd...)
	}
}

// StoreFailed does nothing: the failures of store calls are counted by
// StoreCalled. It implements middleware.Observer.
func (m *Metrics) StoreFailed(keyfunc.Request, error) {}

// StoreBatch records the number of decisions in a batch a Redis store
// sent. It implements middleware.Observer.
func (m *Metrics) StoreBatch(n int) {
	m.batchSize.Record(context.Background(), int64(n), m.baseRecord...)
}

// DenyCacheHit counts a denial by the deny cache under rule. It implements
// middleware.Observer.
func (m *Metrics) DenyCacheHit(rule string) {
	m.denyHits.Add(context.Background(), 1, m.rules.Get(rule).denyHits...)
}

// BreakerChanged sets sluice.circuit_breaker.open: 1 while the breaker of
// any limiter observed is open. It implements middleware.Observer.
func (m *Metrics) BreakerChanged(open bool) {
	if open {
		m.breakersOpen.Add(1)
	} else {
		m.breakersOpen.Add(-1)
	}
}

// StoreHealth sets sluice.store.server.up for e.Server (StoreLabel for an
// event about the store as a whole; OtherLabel, following the last event
// of any of them, for servers past the cap); reports on memory are left to
// Watch, which observes them from Health. It implements
// middleware.Observer.
func (m *Metrics) StoreHealth(e middleware.HealthEvent) {
	if e.Memory != nil {
		return // observed from Health (Watch)
	}
	server := e.Server
	if server == "" {
		server = StoreLabel
	}
	m.serversMu.Lock()
	defer m.serversMu.Unlock()
	if _, ok := m.servers[server]; !ok && len(m.servers) >= m.max {
		server = OtherLabel
	}
	m.servers[server] = e.Up
}

// observe is the callback of the observable instruments.
func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	o.ObserveInt64(m.breaker, boolValue(m.breakersOpen.Load() > 0), m.base)

	m.serversMu.Lock()
	servers := make(map[string]bool, len(m.servers))
	for k, v := range m.servers {
		servers[k] = v
	}
	m.serversMu.Unlock()
	for server, up := range servers {
		o.ObserveInt64(m.serverUp, boolValue(up), m.with(attribute.String("server", server)))
	}

	m.watchMu.Lock()
	lims := make([]*middleware.Limiter, 0, len(m.watched))
	for w := range m.watched {
		lims = append(lims, w.lim)
	}
	m.watchMu.Unlock()
	if len(lims) == 0 {
		return nil
	}
	var sum middleware.Stats
	for _, lim := range lims {
		st := lim.Stats()
		sum.MemoryKeys += st.MemoryKeys
		sum.MemoryEvictions += st.MemoryEvictions
		sum.Waiting += st.Waiting
		sum.SlotsHeld += st.SlotsHeld
	}
	o.ObserveInt64(m.memKeys, int64(sum.MemoryKeys), m.base)
	o.ObserveInt64(m.evictions, int64(sum.MemoryEvictions), m.base)
	o.ObserveInt64(m.waiting, sum.Waiting, m.base)
	o.ObserveInt64(m.slots, int64(sum.SlotsHeld), m.base)
	for _, sm := range middleware.ServerMemories(lims, m.max, OtherLabel) {
		server := m.with(attribute.String("server", sm.Server))
		o.ObserveInt64(m.oom, boolValue(sm.OutOfMemory), server)
		o.ObserveInt64(m.mayEvict, boolValue(sm.Memory.MayEvict()), server)
		if sm.Memory.Evicted >= 0 {
			o.ObserveInt64(m.evictedKeys, sm.Memory.Evicted, server)
		}
	}
	return nil
}

func boolValue(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// numOutcomes bounds the outcomes recorded apart; Outcome values past it,
// which this version does not know, are recorded as "unknown" (index 0).
const numOutcomes = 16

// ruleSeries holds the measurement options of one value of the rule
// attribute, made once so that recording does not build attribute sets.
type ruleSeries struct {
	label     string
	decisions [numOutcomes][]metric.AddOption
	denyHits  []metric.AddOption
}

// newRuleSeries makes the measurement options of the rule attribute's
// value label.
func (m *Metrics) newRuleSeries(label string) *ruleSeries {
	s := &ruleSeries{label: label}
	rule := attribute.String("rule", label)
	for o := range s.decisions {
		s.decisions[o] = []metric.AddOption{m.with(rule, attribute.String("outcome", middleware.Outcome(o).String()))}
	}
	s.denyHits = []metric.AddOption{m.with(rule)}
	return s
}
