package middleware

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
)

// Observer is told what a Limiter and its store do. It is the one way to
// observe sluice: the metrics of the nested modules
// middleware/metrics/prometheus and middleware/metrics/otel, the logs of
// NewLogObserver and one-off hooks (Hooks, a struct of optional functions)
// are all Observers, given to a Limiter with WithObserver. A Limiter passes
// its Observers on to a store that has events of its own (an
// ObservableStore, such as RedisStore) from New until Close.
//
// Each method is one event:
//
//   - Decided: every request Decide (and so Handler and every adapter)
//     handles, exactly once, with its Result; Result.Outcome says how it
//     was decided. Requests WithSkip exempts never reach Decide.
//   - StoreCalled: every call of the store's Take, with how long it took
//     and its error (nil on success). While the circuit breaker is open
//     the store is not called.
//   - StoreFailed: every store failure, whatever the failure policy, so
//     that fail-open outages are seen: the store's Take (not while the
//     circuit breaker is open: BreakerChanged reports that), the fallback
//     store's, taking, renewing and giving back concurrency slots, giving
//     back a place in a leaky bucket's queue. r is the request being
//     decided, or nil for a failure that belongs to no request (renewing
//     the leases of concurrency slots, giving slots back after a handler
//     returned, publishing spare capacity). err wraps ErrStore.
//   - DenyCacheHit: the deny cache turned a request away without asking
//     the store; rule is the rule of the denying limit.
//   - BreakerChanged: the Limiter's circuit breaker opened (the store is
//     bypassed and the failure policy decides) or closed again.
//   - StoreHealth: a server of the store went down (with the cause) or
//     came back. The RedisStore follows each server on its own: on Redis
//     Cluster the event names the node, and one node going down affects
//     only the requests for counters it holds. It also reports on a
//     server's memory (HealthEvent.Memory): out of memory, evicting, or
//     able to evict counters (told to each Observer as it is added, so
//     that the warning comes at start).
//   - StoreBatch: a store that batches decisions (RedisStore) sent a
//     batch of that many decisions to a server in one round trip.
//   - CapacityChanged: a capacity signal moved: the adaptive limit of a
//     rule with AdaptiveConcurrency, or the spare capacity of the
//     Limiter's signal for elastic limits (at most about once per 100ms
//     window of samples each).
//   - ElasticChanged: the effective limit of an elastic limit
//     (Limit.Ceiling) of a rule with static limits moved.
//   - Shed: an adaptive concurrency limit of rule refused a request of
//     priority p.
//   - BanStarted: a limit with a Ban (Limit.Ban) refused a client of
//     rule, which is banned for d from now.
//   - ClientState: how many per-client overrides (Limiter.SetOverride) and
//     bans are in force, with a shared store those of the fleet: reported
//     when this Limiter changes an override and at every sync interval
//     (WithClientSync).
//   - Synced: the coordination layer of rules in lease or write-back mode
//     (Rule.Sync) counted units locally, leased, gave back, dropped, or
//     ran its syncer (SyncFlushed, on the syncer's goroutine); see
//     SyncEvent.
//   - Region: the syncer of a RegionStore synced global counts to a peer
//     region, failed to, found a peer unreachable for longer than the hold
//     time or reachable again (on the syncer's goroutine); see
//     RegionEvent.
//   - Settled: a request with usage limits (Rule.Usage) ended, and the
//     difference between what it used and what it was charged when
//     admitted was charged or given back on one of its usage limits,
//     with the debt it left; see SettleEvent. A request that used just
//     its estimate settles nothing and has no event.
//   - Outbound: the outbound transport (adapters/outbound) waited for a
//     request's turn, gave up on one, or heard from the upstream that it
//     refused one, asked to wait (a pause), or has fewer units left than
//     the budget held; see OutboundEvent.
//
// Methods are called on the goroutine of the request they concern, or of
// the Limiter's background work (renewing leases, publishing spare
// capacity) for events of no request, or of the store for StoreHealth and
// StoreBatch. They must be fast and safe for
// concurrent use, and must not keep r, res, or strings read from them past
// the call: Fiber reuses its buffers and Echo its contexts, and res is
// reused for the next request (copy *res to keep it).
//
// Embed NopObserver in an Observer so that it need implement only the
// events it wants, and keeps compiling when events are added.
type Observer interface {
	Decided(r keyfunc.Request, res *Result)
	StoreCalled(d time.Duration, err error)
	StoreFailed(r keyfunc.Request, err error)
	DenyCacheHit(rule string)
	BreakerChanged(open bool)
	StoreHealth(e HealthEvent)
	StoreBatch(decisions int)
	CapacityChanged(e CapacityEvent)
	ElasticChanged(e ElasticEvent)
	Shed(rule string, p Priority)
	BanStarted(rule string, d time.Duration)
	ClientState(overrides, bans int)
	Synced(e SyncEvent)
	Region(e RegionEvent)
	Settled(e SettleEvent)
	Outbound(e OutboundEvent)
}

// HealthEvent reports that a server of a store went down or slow, or came
// back (Observer.StoreHealth).
type HealthEvent struct {
	// Server is the address of the Redis server (a Cluster node, a Ring
	// shard, the master of a Sentinel-managed client), or "" when the
	// event is about a store as a whole.
	Server string
	// Up reports whether the server is answering again.
	Up bool
	// Slow reports that the server answers, but later than the store's
	// bound allows (see RedisConfig.Timeout): requests for its counters
	// go to the failure policy at once, as while it is down, until it is
	// Up again. A server may go from down to slow and back as probes
	// find it answering late or not at all.
	Slow bool
	// Cause is why it went down or slow (a connection error, a batch that
	// was outstanding too long, a PING answered late); nil when Up, but
	// for a report on memory.
	Cause error
	// Memory, when not nil, makes the event a report on the server's
	// memory rather than on its reachability (Up is true: the server
	// answers): the server refuses writes for want of memory
	// (Memory.OutOfMemory), evicted keys (Memory.EvictedSince), or may
	// evict rate-limit counters (Memory.Memory.MayEvict), Cause then
	// wrapping ErrOutOfMemory or ErrMayEvict and saying what to do; or a
	// server that could evict no longer can (Cause nil). See
	// RedisConfig.MemoryCheck.
	Memory *MemoryReport
}

// NopObserver is an Observer that does nothing. Embed it in an Observer
// that implements only some events: the others, and events added later,
// are then ignored.
type NopObserver struct{}

// Decided does nothing.
func (NopObserver) Decided(keyfunc.Request, *Result) {}

// StoreCalled does nothing.
func (NopObserver) StoreCalled(time.Duration, error) {}

// StoreFailed does nothing.
func (NopObserver) StoreFailed(keyfunc.Request, error) {}

// DenyCacheHit does nothing.
func (NopObserver) DenyCacheHit(string) {}

// BreakerChanged does nothing.
func (NopObserver) BreakerChanged(bool) {}

// StoreHealth does nothing.
func (NopObserver) StoreHealth(HealthEvent) {}

// StoreBatch does nothing.
func (NopObserver) StoreBatch(int) {}

// CapacityChanged does nothing.
func (NopObserver) CapacityChanged(CapacityEvent) {}

// ElasticChanged does nothing.
func (NopObserver) ElasticChanged(ElasticEvent) {}

// Shed does nothing.
func (NopObserver) Shed(string, Priority) {}

// BanStarted does nothing.
func (NopObserver) BanStarted(string, time.Duration) {}

// ClientState does nothing.
func (NopObserver) ClientState(int, int) {}

// Synced does nothing.
func (NopObserver) Synced(SyncEvent) {}

// Region does nothing.
func (NopObserver) Region(RegionEvent) {}

// Settled does nothing.
func (NopObserver) Settled(SettleEvent) {}

// Outbound does nothing.
func (NopObserver) Outbound(OutboundEvent) {}

// Hooks is an Observer made of optional functions, for one-off hooks in the
// manner of net/http/httptrace.ClientTrace: each field On<Event> is called
// for the Observer method <Event> (see Observer for when, and with what),
// and a nil field ignores its event. Give a *Hooks to WithObserver:
//
//	middleware.WithObserver(&middleware.Hooks{
//		OnStoreFailed: func(r keyfunc.Request, err error) { log.Print(err) },
//	})
//
// The functions are read at each event; do not change them once the Hooks
// is in use.
type Hooks struct {
	OnDecided         func(r keyfunc.Request, res *Result)
	OnStoreCalled     func(d time.Duration, err error)
	OnStoreFailed     func(r keyfunc.Request, err error)
	OnDenyCacheHit    func(rule string)
	OnBreakerChanged  func(open bool)
	OnStoreHealth     func(e HealthEvent)
	OnStoreBatch      func(decisions int)
	OnCapacityChanged func(e CapacityEvent)
	OnElasticChanged  func(e ElasticEvent)
	OnShed            func(rule string, p Priority)
	OnBanStarted      func(rule string, d time.Duration)
	OnClientState     func(overrides, bans int)
	OnSynced          func(e SyncEvent)
	OnRegion          func(e RegionEvent)
	OnSettled         func(e SettleEvent)
	OnOutbound        func(e OutboundEvent)
}

var _ Observer = (*Hooks)(nil)

// Decided calls OnDecided, if set.
func (h *Hooks) Decided(r keyfunc.Request, res *Result) {
	if h != nil && h.OnDecided != nil {
		h.OnDecided(r, res)
	}
}

// StoreCalled calls OnStoreCalled, if set.
func (h *Hooks) StoreCalled(d time.Duration, err error) {
	if h != nil && h.OnStoreCalled != nil {
		h.OnStoreCalled(d, err)
	}
}

// StoreFailed calls OnStoreFailed, if set.
func (h *Hooks) StoreFailed(r keyfunc.Request, err error) {
	if h != nil && h.OnStoreFailed != nil {
		h.OnStoreFailed(r, err)
	}
}

// DenyCacheHit calls OnDenyCacheHit, if set.
func (h *Hooks) DenyCacheHit(rule string) {
	if h != nil && h.OnDenyCacheHit != nil {
		h.OnDenyCacheHit(rule)
	}
}

// BreakerChanged calls OnBreakerChanged, if set.
func (h *Hooks) BreakerChanged(open bool) {
	if h != nil && h.OnBreakerChanged != nil {
		h.OnBreakerChanged(open)
	}
}

// StoreHealth calls OnStoreHealth, if set.
func (h *Hooks) StoreHealth(e HealthEvent) {
	if h != nil && h.OnStoreHealth != nil {
		h.OnStoreHealth(e)
	}
}

// StoreBatch calls OnStoreBatch, if set.
func (h *Hooks) StoreBatch(decisions int) {
	if h != nil && h.OnStoreBatch != nil {
		h.OnStoreBatch(decisions)
	}
}

// CapacityChanged calls OnCapacityChanged, if set.
func (h *Hooks) CapacityChanged(e CapacityEvent) {
	if h != nil && h.OnCapacityChanged != nil {
		h.OnCapacityChanged(e)
	}
}

// ElasticChanged calls OnElasticChanged, if set.
func (h *Hooks) ElasticChanged(e ElasticEvent) {
	if h != nil && h.OnElasticChanged != nil {
		h.OnElasticChanged(e)
	}
}

// Shed calls OnShed, if set.
func (h *Hooks) Shed(rule string, p Priority) {
	if h != nil && h.OnShed != nil {
		h.OnShed(rule, p)
	}
}

// BanStarted calls OnBanStarted, if set.
func (h *Hooks) BanStarted(rule string, d time.Duration) {
	if h != nil && h.OnBanStarted != nil {
		h.OnBanStarted(rule, d)
	}
}

// ClientState calls OnClientState, if set.
func (h *Hooks) ClientState(overrides, bans int) {
	if h != nil && h.OnClientState != nil {
		h.OnClientState(overrides, bans)
	}
}

// Synced calls OnSynced, if set.
func (h *Hooks) Synced(e SyncEvent) {
	if h != nil && h.OnSynced != nil {
		h.OnSynced(e)
	}
}

// Region calls OnRegion, if set.
func (h *Hooks) Region(e RegionEvent) {
	if h != nil && h.OnRegion != nil {
		h.OnRegion(e)
	}
}

// Settled calls OnSettled, if set.
func (h *Hooks) Settled(e SettleEvent) {
	if h != nil && h.OnSettled != nil {
		h.OnSettled(e)
	}
}

// Outbound calls OnOutbound, if set.
func (h *Hooks) Outbound(e OutboundEvent) {
	if h != nil && h.OnOutbound != nil {
		h.OnOutbound(e)
	}
}

// WithObserver adds o to the observers of the limiter (and of its store,
// if it is an ObservableStore). It may be given several times (metrics and
// logs, say); each observer sees every event, in the order given.
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.errorf("WithObserver: nil Observer")
			return
		}
		c.observers = append(c.observers, o)
	}
}

// Adding an event: a method on Observer, documented in its list; a no-op
// on NopObserver; a field On<Method> and the method on Hooks
// (TestHooksCoverObserver checks them); the method on multiObserver
// (TestMultiObserverForwards); and the event in the metrics modules and, if
// operators should see it, in LogObserver.

// combine returns one Observer for obs: nil for none, the one, or their
// fan-out.
func combine(obs []Observer) Observer {
	switch len(obs) {
	case 0:
		return nil
	case 1:
		return obs[0]
	}
	return multiObserver(obs)
}

// multiObserver tells every one of its Observers, in order.
type multiObserver []Observer

func (m multiObserver) Decided(r keyfunc.Request, res *Result) {
	for _, o := range m {
		o.Decided(r, res)
	}
}

func (m multiObserver) StoreCalled(d time.Duration, err error) {
	for _, o := range m {
		o.StoreCalled(d, err)
	}
}

func (m multiObserver) StoreFailed(r keyfunc.Request, err error) {
	for _, o := range m {
		o.StoreFailed(r, err)
	}
}

func (m multiObserver) DenyCacheHit(rule string) {
	for _, o := range m {
		o.DenyCacheHit(rule)
	}
}

func (m multiObserver) BreakerChanged(open bool) {
	for _, o := range m {
		o.BreakerChanged(open)
	}
}

func (m multiObserver) StoreHealth(e HealthEvent) {
	for _, o := range m {
		o.StoreHealth(e)
	}
}

func (m multiObserver) StoreBatch(n int) {
	for _, o := range m {
		o.StoreBatch(n)
	}
}

func (m multiObserver) CapacityChanged(e CapacityEvent) {
	for _, o := range m {
		o.CapacityChanged(e)
	}
}

func (m multiObserver) ElasticChanged(e ElasticEvent) {
	for _, o := range m {
		o.ElasticChanged(e)
	}
}

func (m multiObserver) BanStarted(rule string, d time.Duration) {
	for _, o := range m {
		o.BanStarted(rule, d)
	}
}

func (m multiObserver) ClientState(overrides, bans int) {
	for _, o := range m {
		o.ClientState(overrides, bans)
	}
}

func (m multiObserver) Synced(e SyncEvent) {
	for _, o := range m {
		o.Synced(e)
	}
}

func (m multiObserver) Settled(e SettleEvent) {
	for _, o := range m {
		o.Settled(e)
	}
}

func (m multiObserver) Region(e RegionEvent) {
	for _, o := range m {
		o.Region(e)
	}
}

func (m multiObserver) Outbound(e OutboundEvent) {
	for _, o := range m {
		o.Outbound(e)
	}
}

func (m multiObserver) Shed(rule string, p Priority) {
	for _, o := range m {
		o.Shed(rule, p)
	}
}

// observedResults holds the copies of Results shown to observers, so that
// the Result of a request (on its goroutine's stack) never escapes to the
// heap: a decision observed allocates nothing.
var observedResults = sync.Pool{New: func() any { return new(Result) }}

// decided tells the observers about res. res itself does not escape: the
// observers see a pooled copy.
func (c *config) decided(r keyfunc.Request, res *Result) {
	p := observedResults.Get().(*Result)
	*p = *res
	c.obs.Decided(r, p)
	*p = Result{}
	observedResults.Put(p)
}

// report tells the observers about a store failure.
func (c *config) report(r keyfunc.Request, err error) {
	if c.obs != nil {
		c.obs.StoreFailed(r, err)
	}
}
