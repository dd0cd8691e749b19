// Package sluiceprom exports what a sluice Limiter does as Prometheus
// metrics.
//
// It is a module of its own, so that programs that do not use it never
// download client_golang. A Metrics is a middleware.Observer, given to the
// limiter with middleware.WithObserver, and a prometheus.Collector:
//
//	m, err := sluiceprom.New(prometheus.DefaultRegisterer)
//	if err != nil { … }
//	lim, err := middleware.NewRules(rules, middleware.WithObserver(m))
//	if err != nil { … }
//	m.Watch(lim) // memory, queue and slot figures, read at scrape time
//	go reloader.Watch(ctx, 10*time.Second, m.ObserveReload)
//	http.Handle("/metrics", promhttp.Handler())
//
// The metrics, all prefixed "sluice_" (MetricNames lists them):
//
//	sluice_decisions_total{rule,outcome}   counter    every request Decide handled
//	sluice_store_call_duration_seconds     histogram  every call of the store
//	sluice_store_errors_total              counter    store calls that failed
//	sluice_store_batch_size                histogram  decisions per round trip to a Redis server
//	sluice_deny_cache_hits_total{rule}     counter    denials answered by the deny cache
//	sluice_circuit_breaker_open            gauge      1 while a circuit breaker is open
//	sluice_store_server_up{server}         gauge      1 while a store server answers
//	sluice_store_server_out_of_memory{server}  gauge  1 while a Redis server refuses writes (OOM)
//	sluice_store_server_may_evict{server}  gauge      1 while a Redis server's maxmemory-policy may evict counters
//	sluice_store_server_evicted_keys_total{server}  counter  keys a Redis server evicted (its evicted_keys)
//	sluice_memory_keys                     gauge      counters the in-memory stores hold
//	sluice_memory_evictions_total          counter    counters they dropped to stay in MaxKeys
//	sluice_queue_waiting                   gauge      requests waiting in a leaky bucket's queue
//	sluice_concurrency_slots_held          gauge      requests holding concurrency slots
//	sluice_rules_reloads_total{result}     counter    rules reloads, "ok" or "error"
//	sluice_rules_source_failures           gauge      reads of the rules source failed in a row
//	sluice_rules_source_last_load_seconds  gauge      Unix time of the last good load from the source
//	sluice_adaptive_limit{rule}            gauge      adaptive concurrency limit in force
//	sluice_spare_capacity{rule}            gauge      spare capacity, 0 to 1 (rule="" for elastic limits' signal)
//	sluice_elastic_limit{rule,policy}      gauge      limit in force of an elastic limit
//	sluice_shed_total{rule,priority}       counter    requests refused by an adaptive concurrency limit
//	sluice_sync_unsynced_total{rule}       counter    units admitted in memory in write_back mode
//	sluice_sync_flush_duration_seconds     histogram  runs of the syncer of lease and write_back rules
//	sluice_sync_flush_errors_total         counter    runs of the syncer with a failed call
//	sluice_sync_lease_granted_total{rule}  counter    units leased in lease mode
//	sluice_sync_gave_back_total{rule}      counter    leased units not used and given back
//	sluice_sync_dropped_total{rule}        counter    units of evicted counters the fleet's count misses
//	sluice_bans_total{rule}                counter    clients banned by a limit with a ban
//	sluice_bans_in_force                   gauge      bans in force (the fleet's, with Redis)
//	sluice_overrides_in_force              gauge      per-client overrides in force (the fleet's, with Redis)
//	sluice_region_peer_lag_seconds{peer}   histogram  syncs of global counts to a peer region
//	sluice_region_sync_errors_total{peer}  counter    failed syncs to a peer region
//	sluice_region_peer_unreachable{peer}   gauge      1 while a peer counts as its share
//	sluice_region_dropped_total            counter    global counters not synced (too many)
//	sluice_usage_settled_total{rule,policy}         counter    usage charged after the fact, beyond estimates
//	sluice_usage_refunded_total{rule,policy}        counter    estimates given back when requests used less
//	sluice_usage_debt{rule,policy}                  histogram  debt a settle left, in units past the limit
//	sluice_usage_settle_errors_total{rule}          counter    settles the store failed to count
//	sluice_outbound_waits_total{rule}      counter    outgoing requests that waited for their turn
//	sluice_outbound_wait_seconds           histogram  how long outgoing requests waited
//	sluice_outbound_gave_up_total{rule}    counter    outgoing requests that could not fit in time, not sent
//	sluice_outbound_upstream_refused_total{rule}  counter  outgoing requests the upstream refused (429)
//	sluice_outbound_pauses_total{rule}     counter    pauses the upstream asked for (Retry-After)
//	sluice_outbound_lowered_units_total{rule}  counter  units taken off the budget to follow the upstream
//	sluice_outbound_learned_limit{rule,unit}   gauge    the limit learned of the upstream, as last changed
//	sluice_outbound_learned_ratio{rule,unit}   gauge    that limit over the limit in force it lowers
//	sluice_outbound_cuts_total{rule,unit}      counter  refusals that cut the fleet's learned fraction
//
// Labels never carry a client's key. Rule names and server addresses come
// from configuration, but their distinct values are capped all the same
// (WithMaxLabelValues); the rest are counted under OtherLabel.
//
// The deploy folder beside this package holds Prometheus alerting rules
// (alerts.yml) and a Grafana dashboard (dashboard.json) over these metrics.
// docs/operations.md describes them beside the other ways of watching a
// Limiter; docs/usage.md, docs/fleet.md, docs/regions.md, docs/overload.md
// and docs/outbound.md say what their capability's metrics mean.
package sluiceprom

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/labelcap"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// The names of the metrics.
const (
	DecisionsTotal     = "sluice_decisions_total"
	StoreCallDuration  = "sluice_store_call_duration_seconds"
	StoreErrorsTotal   = "sluice_store_errors_total"
	StoreBatchSize     = "sluice_store_batch_size"
	DenyCacheHitsTotal = "sluice_deny_cache_hits_total"
	CircuitBreakerOpen = "sluice_circuit_breaker_open"
	StoreServerUp      = "sluice_store_server_up"
	// StoreServerOutOfMemory, StoreServerMayEvict and
	// StoreServerEvictedKeys are a Redis server's memory, read from the
	// watched limiters' Health (Watch).
	StoreServerOutOfMemory = "sluice_store_server_out_of_memory"
	StoreServerMayEvict    = "sluice_store_server_may_evict"
	StoreServerEvictedKeys = "sluice_store_server_evicted_keys_total"
	MemoryKeys             = "sluice_memory_keys"
	MemoryEvictionsTotal   = "sluice_memory_evictions_total"
	QueueWaiting           = "sluice_queue_waiting"
	ConcurrencySlotsHeld   = "sluice_concurrency_slots_held"
	RulesReloadsTotal      = "sluice_rules_reloads_total"
	RulesSourceFailures    = "sluice_rules_source_failures"
	RulesSourceLastLoad    = "sluice_rules_source_last_load_seconds"
)

// MetricNames lists the name of every metric a Metrics exports, for
// checking dashboards and alerting rules against. A histogram's series add
// the suffixes _bucket, _sum and _count to its name.
var MetricNames = []string{
	DecisionsTotal,
	StoreCallDuration,
	StoreErrorsTotal,
	StoreBatchSize,
	DenyCacheHitsTotal,
	CircuitBreakerOpen,
	StoreServerUp,
	StoreServerOutOfMemory,
	StoreServerMayEvict,
	StoreServerEvictedKeys,
	MemoryKeys,
	MemoryEvictionsTotal,
	QueueWaiting,
	ConcurrencySlotsHeld,
	RulesReloadsTotal,
	RulesSourceFailures,
	RulesSourceLastLoad,
	AdaptiveLimit,
	SpareCapacity,
	ElasticLimit,
	ShedTotal,
	SyncUnsyncedTotal,
	SyncFlushDuration,
	SyncFlushErrors,
	SyncLeaseGranted,
	SyncGaveBackTotal,
	SyncDroppedTotal,
	BansTotal,
	Bans,
	Overrides,
	RegionPeerLag,
	RegionSyncErrors,
	RegionPeerUnreachable,
	RegionDroppedTotal,
	UsageSettledTotal,
	UsageRefundedTotal,
	UsageDebt,
	UsageErrorsTotal,
	OutboundWaitsTotal,
	OutboundWaitSeconds,
	OutboundGaveUpTotal,
	OutboundRefusedTotal,
	OutboundPausesTotal,
	OutboundLoweredTotal,
	OutboundLearnedLimit,
	OutboundLearnedRatio,
	OutboundCutsTotal,
}

// DefaultBuckets are the bounds, in seconds, of the store call duration
// histogram: from 100µs, a call to the in-memory store or a pipelined
// Redis round trip on the same host, to 1s, past any sensible store
// timeout.
var DefaultBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}

// DefaultMaxLabelValues is how many distinct values of the rule label,
// and of the server label, a Metrics exports by default.
const DefaultMaxLabelValues = 1000

// OtherLabel is the value of the rule or server label that counts the
// values past the cap (see WithMaxLabelValues).
const OtherLabel = "other"

// StoreLabel is the value of the server label of a health event about the
// store as a whole (middleware.HealthEvent with no Server).
const StoreLabel = "store"

// Option configures a Metrics.
type Option func(*options)

type options struct {
	maxValues   int
	buckets     []float64
	constLabels prometheus.Labels
	errs        []error
}

// WithMaxLabelValues caps at n the distinct values of the rule label and,
// separately, of the server label (DefaultMaxLabelValues by default). Rule
// names past the first n seen are counted under OtherLabel; so are server
// addresses. n must be positive.
func WithMaxLabelValues(n int) Option {
	return func(o *options) {
		if n <= 0 {
			o.errs = append(o.errs, fmt.Errorf("sluiceprom: WithMaxLabelValues: want n > 0, got %d", n))
			return
		}
		o.maxValues = n
	}
}

// WithBuckets sets the bounds, in seconds, of the store call duration
// histogram, in increasing order. The default is DefaultBuckets.
func WithBuckets(b []float64) Option {
	return func(o *options) {
		if len(b) == 0 || !sort.Float64sAreSorted(b) {
			o.errs = append(o.errs, fmt.Errorf("sluiceprom: WithBuckets: want increasing bounds, got %v", b))
			return
		}
		o.buckets = append([]float64(nil), b...)
	}
}

// WithConstLabels adds labels with fixed values to every metric, such as
// {"limiter": "public"}, so that the metrics of several limiters can be
// registered with one Registerer: each with the same label names and its
// own values. (A Metrics given to several limiters adds them up instead.)
func WithConstLabels(l prometheus.Labels) Option {
	return func(o *options) { o.constLabels = l }
}

// Metrics counts what the limiters it observes do. It implements
// middleware.Observer and prometheus.Collector, and is safe for
// concurrent use. Given to several limiters, it adds up what they do.
type Metrics struct {
	max int

	rules *labelcap.Table[ruleSeries] // read lock-free on every request

	storeDuration prometheus.Histogram
	storeErrors   prometheus.Counter
	batchSize     prometheus.Histogram
	breakersOpen  atomic.Int64
	reloadsOK     atomic.Uint64
	reloadsErr    atomic.Uint64

	serversMu sync.Mutex
	servers   map[string]bool // by label; true when up

	watchMu  sync.Mutex
	watched  map[*watch]struct{}
	watchSeq int

	decisionsDesc, denyHitsDesc, breakerDesc, serverUpDesc *prometheus.Desc
	memKeysDesc, evictionsDesc, waitingDesc, slotsDesc     *prometheus.Desc
	oomDesc, mayEvictDesc, evictedDesc                     *prometheus.Desc
	reloadsDesc                                            *prometheus.Desc

	sourceFailures, sourceLoaded prometheus.Gauge

	capacity capacityMetrics // capacity.go
	sync     syncMetrics     // sync.go
	clients  clientMetrics   // clients.go
	region   regionMetrics   // region.go
	usage    usageMetrics    // usage.go
	outbound outboundMetrics // outbound.go
}

type watch struct{ lim *middleware.Limiter }

var (
	_ middleware.Observer  = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns a Metrics and registers it with reg, unless reg is nil (the
// caller then registers it, as any prometheus.Collector). Pass
// prometheus.DefaultRegisterer for the registry promhttp.Handler serves.
// New returns an error for an invalid option or when reg refuses the
// metrics, for instance because they are registered already: Metrics
// registered with one Registerer need WithConstLabels with the same label
// names and different values.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	o := options{maxValues: DefaultMaxLabelValues, buckets: DefaultBuckets}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("sluiceprom: nil Option")
		}
		opt(&o)
	}
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	cl := o.constLabels
	m := &Metrics{
		max:     o.maxValues,
		servers: map[string]bool{},
		watched: map[*watch]struct{}{},
		storeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        StoreCallDuration,
			Help:        "How long calls of the rate limiter's store took, failed ones included.",
			Buckets:     o.buckets,
			ConstLabels: cl,
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        StoreBatchSize,
			Help:        "Decisions per batch a Redis store sent to a server in one round trip.",
			Buckets:     []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
			ConstLabels: cl,
		}),
		sourceFailures: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        RulesSourceFailures,
			Help:        "Reads of the rules source (config.Source) that failed in a row; 0 once it answers again.",
			ConstLabels: cl,
		}),
		sourceLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name:        RulesSourceLastLoad,
			Help:        "Unix time, in seconds, of the last good load of the rules from their source.",
			ConstLabels: cl,
		}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        StoreErrorsTotal,
			Help:        "Calls of the rate limiter's store that failed.",
			ConstLabels: cl,
		}),
		decisionsDesc: prometheus.NewDesc(DecisionsTotal,
			"Requests the rate limiter decided, by rule and outcome (allowed, denied, shadow_denied, failed_open, fallback, no_key, error, unlimited, gave_up).",
			[]string{"rule", "outcome"}, cl),
		denyHitsDesc: prometheus.NewDesc(DenyCacheHitsTotal,
			"Requests the deny cache turned away without asking the store, by the rule that denied them.",
			[]string{"rule"}, cl),
		breakerDesc: prometheus.NewDesc(CircuitBreakerOpen,
			"1 while the circuit breaker of a rate limiter is open and its store is not called, 0 otherwise.",
			nil, cl),
		serverUpDesc: prometheus.NewDesc(StoreServerUp,
			"1 while a server of the rate limiter's store answers, 0 while it is down; only servers that went down at least once are listed.",
			[]string{"server"}, cl),
		oomDesc: prometheus.NewDesc(StoreServerOutOfMemory,
			"1 while a Redis server of the rate limiter's store refuses writes for want of memory (an OOM reply in the last 10 s): requests that would write go to the failure policy. Read from the watched limiters.",
			[]string{"server"}, cl),
		mayEvictDesc: prometheus.NewDesc(StoreServerMayEvict,
			"1 while a Redis server of the rate limiter's store has a maxmemory and a maxmemory-policy other than noeviction: it may evict counters, whose clients then start afresh. Read from the watched limiters.",
			[]string{"server"}, cl),
		evictedDesc: prometheus.NewDesc(StoreServerEvictedKeys,
			"Keys a Redis server of the rate limiter's store evicted since it started (its evicted_keys, read every RedisConfig.MemoryCheck). Read from the watched limiters.",
			[]string{"server"}, cl),
		memKeysDesc: prometheus.NewDesc(MemoryKeys,
			"Counters the rate limiter's in-memory stores hold (the store or the fail-local fallback).",
			nil, cl),
		evictionsDesc: prometheus.NewDesc(MemoryEvictionsTotal,
			"Counters the rate limiter's in-memory stores dropped to stay within their MaxKeys.",
			nil, cl),
		waitingDesc: prometheus.NewDesc(QueueWaiting,
			"Requests waiting for their turn in a leaky bucket's queue.",
			nil, cl),
		slotsDesc: prometheus.NewDesc(ConcurrencySlotsHeld,
			"Requests holding concurrency slots.",
			nil, cl),
		reloadsDesc: prometheus.NewDesc(RulesReloadsTotal,
			"Reloads of the rules tried, by result: ok when the new rules are in force, error when the previous ones stay.",
			[]string{"result"}, cl),
	}
	m.capacity = newCapacityMetrics(cl)
	m.sync = newSyncMetrics(cl)
	m.clients = newClientMetrics(cl)
	m.region = newRegionMetrics(cl)
	m.usage = newUsageMetrics(cl)
	m.outbound = newOutboundMetrics(cl)
	m.rules = labelcap.New(m.max, OtherLabel, func(label string) *ruleSeries { return &ruleSeries{label: label} })
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, fmt.Errorf("sluiceprom: registering the metrics: %w", err)
		}
	}
	return m, nil
}

// Watch has the metrics read lim's Stats when they are scraped: the gauges
// sluice_memory_keys, sluice_queue_waiting and
// sluice_concurrency_slots_held and the counter
// sluice_memory_evictions_total, added up over the watched limiters, and
// the memory of their stores' Redis servers from their Health
// (sluice_store_server_out_of_memory, sluice_store_server_may_evict and
// sluice_store_server_evicted_keys_total, one series per server, for
// servers whose figures were read), all exported only while at least one
// limiter is watched. The limiter is made after
// the Metrics, since it takes the Metrics as an option. unwatch stops
// reading lim; call it if lim is closed before the Metrics is
// unregistered.
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
// Reloader.Reload. A nil err counts under result="ok", any other under
// result="error".
func (m *Metrics) ObserveReload(err error) {
	if err == nil {
		m.reloadsOK.Add(1)
	} else {
		m.reloadsErr.Add(1)
	}
}

// Decided counts the decision under its rule and outcome. It implements
// middleware.Observer.
func (m *Metrics) Decided(_ keyfunc.Request, res *middleware.Result) {
	if res == nil {
		return
	}
	o := int(res.Outcome)
	if o >= numOutcomes {
		o = 0 // labelled "unknown"
	}
	m.rules.Get(res.Rule).decisions[o].Add(1)
}

// StoreCalled observes the duration of a store call and counts it as an
// error if err is not nil. It implements middleware.Observer.
func (m *Metrics) StoreCalled(d time.Duration, err error) {
	m.storeDuration.Observe(d.Seconds())
	if err != nil {
		m.storeErrors.Inc()
	}
}

// StoreFailed does nothing: the failures of store calls are counted by
// StoreCalled. It implements middleware.Observer.
func (m *Metrics) StoreFailed(keyfunc.Request, error) {}

// ObserveSourceStatus sets the rules source's gauges from st: use it as
// config.SourceOptions.OnStatus (or call it from yours).
func (m *Metrics) ObserveSourceStatus(st config.Status) {
	m.sourceFailures.Set(float64(st.Failures))
	if !st.LoadedAt.IsZero() {
		m.sourceLoaded.Set(float64(st.LoadedAt.UnixMilli()) / 1000)
	}
}

// StoreBatch observes the number of decisions in a batch a Redis store
// sent. It implements middleware.Observer.
func (m *Metrics) StoreBatch(n int) { m.batchSize.Observe(float64(n)) }

// DenyCacheHit counts a denial by the deny cache under rule. It implements
// middleware.Observer.
func (m *Metrics) DenyCacheHit(rule string) {
	m.rules.Get(rule).denyHits.Add(1)
}

// BreakerChanged sets sluice_circuit_breaker_open: 1 while the breaker of
// any limiter observed is open. It implements middleware.Observer.
func (m *Metrics) BreakerChanged(open bool) {
	if open {
		m.breakersOpen.Add(1)
	} else {
		m.breakersOpen.Add(-1)
	}
}

// StoreHealth sets sluice_store_server_up for e.Server (StoreLabel for an
// event about the store as a whole; OtherLabel, following the last event
// of any of them, for servers past the cap); reports on memory are left
// to Watch, which reads them from Health. It implements
// middleware.Observer.
func (m *Metrics) StoreHealth(e middleware.HealthEvent) {
	if e.Memory != nil {
		return // read from Health (Watch)
	}
	server := e.Server
	if server == "" {
		server = StoreLabel
	}
	m.serversMu.Lock()
	defer m.serversMu.Unlock()
	if _, ok := m.servers[server]; !ok && len(m.servers) >= m.max {
		// Past the cap, OtherLabel follows the last event of any of the
		// servers folded into it.
		server = OtherLabel
	}
	m.servers[server] = e.Up
}

// Describe sends the descriptions of every metric. It implements
// prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		m.decisionsDesc, m.denyHitsDesc, m.breakerDesc, m.serverUpDesc,
		m.memKeysDesc, m.evictionsDesc, m.waitingDesc, m.slotsDesc, m.reloadsDesc,
		m.oomDesc, m.mayEvictDesc, m.evictedDesc,
	} {
		ch <- d
	}
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// collectors returns the metrics kept by prometheus collectors of their
// own: the store's, the sources', and those of the capacity signals,
// the coordination layer, bans and overrides, and regions.
func (m *Metrics) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{m.storeDuration, m.storeErrors, m.sourceFailures, m.sourceLoaded, m.batchSize}
	cs = append(cs, m.capacity.collectors()...)
	cs = append(cs, m.sync.collectors()...)
	cs = append(cs, m.clients.collectors()...)
	cs = append(cs, m.usage.collectors()...)
	cs = append(cs, m.region.collectors()...)
	return append(cs, m.outbound.collectors()...)
}

// Collect sends the current value of every metric, reading the Stats of
// the watched limiters. It implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.rules.Each(func(_ string, s *ruleSeries) {
		for o := range s.decisions {
			if n := s.decisions[o].Load(); n > 0 {
				ch <- prometheus.MustNewConstMetric(m.decisionsDesc, prometheus.CounterValue, float64(n), s.label, middleware.Outcome(o).String())
			}
		}
		if n := s.denyHits.Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(m.denyHitsDesc, prometheus.CounterValue, float64(n), s.label)
		}
	})
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	ch <- prometheus.MustNewConstMetric(m.breakerDesc, prometheus.GaugeValue, boolValue(m.breakersOpen.Load() > 0))

	m.serversMu.Lock()
	for server, up := range m.servers {
		ch <- prometheus.MustNewConstMetric(m.serverUpDesc, prometheus.GaugeValue, boolValue(up), server)
	}
	m.serversMu.Unlock()

	ch <- prometheus.MustNewConstMetric(m.reloadsDesc, prometheus.CounterValue, float64(m.reloadsOK.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(m.reloadsDesc, prometheus.CounterValue, float64(m.reloadsErr.Load()), "error")

	m.watchMu.Lock()
	lims := make([]*middleware.Limiter, 0, len(m.watched))
	for w := range m.watched {
		lims = append(lims, w.lim)
	}
	m.watchMu.Unlock()
	if len(lims) == 0 {
		return
	}
	var sum middleware.Stats
	for _, lim := range lims {
		st := lim.Stats()
		sum.MemoryKeys += st.MemoryKeys
		sum.MemoryEvictions += st.MemoryEvictions
		sum.Waiting += st.Waiting
		sum.SlotsHeld += st.SlotsHeld
	}
	ch <- prometheus.MustNewConstMetric(m.memKeysDesc, prometheus.GaugeValue, float64(sum.MemoryKeys))
	ch <- prometheus.MustNewConstMetric(m.evictionsDesc, prometheus.CounterValue, float64(sum.MemoryEvictions))
	ch <- prometheus.MustNewConstMetric(m.waitingDesc, prometheus.GaugeValue, float64(sum.Waiting))
	ch <- prometheus.MustNewConstMetric(m.slotsDesc, prometheus.GaugeValue, float64(sum.SlotsHeld))
	for _, sm := range middleware.ServerMemories(lims, m.max, OtherLabel) {
		ch <- prometheus.MustNewConstMetric(m.oomDesc, prometheus.GaugeValue, boolValue(sm.OutOfMemory), sm.Server)
		ch <- prometheus.MustNewConstMetric(m.mayEvictDesc, prometheus.GaugeValue, boolValue(sm.Memory.MayEvict()), sm.Server)
		if sm.Memory.Evicted >= 0 {
			ch <- prometheus.MustNewConstMetric(m.evictedDesc, prometheus.CounterValue, float64(sm.Memory.Evicted), sm.Server)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// numOutcomes bounds the outcomes counted apart; Outcome values past it,
// which this version does not know, are counted as "unknown" (index 0).
const numOutcomes = 16

// ruleSeries holds the counters of one value of the rule label.
type ruleSeries struct {
	label     string
	decisions [numOutcomes]atomic.Uint64
	denyHits  atomic.Uint64
}
